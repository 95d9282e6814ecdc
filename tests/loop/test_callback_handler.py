"""CallbackHandler dispatch: event keyword arguments, order, custom events, ``listens``.

The semantics shared with transformers' own handler (mocks, patched methods, changes made
during an event) are tested side by side in tests/integrations/test_dispatch_semantics.py.
"""

from __future__ import annotations

import pytest

from hf_callbacks_plus.loop import CallbackHandler, TrainerCallback, TrainerControl, TrainerState


class KwargsSeen(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(kwargs)


class Plain(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(kwargs)


class PlainSubclass(Plain):
    pass


def test_event_kwargs_follow_the_handler_attributes():
    callback = KwargsSeen()
    handler = CallbackHandler([callback], model="m", optimizer="o")
    handler.on_step_end(None, TrainerState(), TrainerControl())
    handler.train_dataloader = "data"
    handler.model = "m2"
    handler.on_step_end(None, TrainerState(), TrainerControl())
    handler.call_event("on_step_end", None, TrainerState(), TrainerControl(), extra=1)
    first, second, third = callback.seen
    assert first == {
        "model": "m",
        "processing_class": None,
        "optimizer": "o",
        "lr_scheduler": None,
        "train_dataloader": None,
        "eval_dataloader": None,
    }
    assert (second["model"], second["train_dataloader"]) == ("m2", "data")
    assert (third["model"], third["extra"]) == ("m2", 1)
    assert handler.model == "m2"


def test_passing_a_handler_keyword_again_raises_type_error_as_in_transformers():
    handler = CallbackHandler([KwargsSeen()], model="m")
    with pytest.raises(TypeError, match="model"):
        handler.call_event("on_step_end", None, TrainerState(), TrainerControl(), model="m3")


def test_listens_is_looked_up_at_call_time():
    callback = KwargsSeen()
    handler = CallbackHandler([callback])
    assert handler.listens("on_step_end") and not handler.listens("on_log")
    callback.on_log = lambda *args, **kwargs: None  # patched on the instance later
    assert handler.listens("on_log")
    handler.callbacks.clear()
    assert not handler.listens("on_step_end")


class First(TrainerCallback):
    pass


class Second(TrainerCallback):
    pass


def names(handler: CallbackHandler) -> list[str]:
    return [type(cb).__name__ for cb in handler.callbacks]


def test_order_first_before_after_by_class_or_instance():
    second = Second()
    handler = CallbackHandler([First, second])
    handler.add_callback(Plain, first=True)
    handler.add_callback(KwargsSeen(), before=Second)
    handler.add_callback(PlainSubclass(), after=second)
    assert names(handler) == ["Plain", "First", "KwargsSeen", "Second", "PlainSubclass"]


def test_order_errors_name_the_argument_and_the_choices():
    handler = CallbackHandler([First()])
    with pytest.raises(ValueError, match=r"at most one of first=True, before=\.\.\., after=\.\.\."):
        handler.add_callback(Second(), first=True, before=First)
    with pytest.raises(ValueError, match=r"before=.*Second.* is not among the callbacks.*\['First'\]"):
        handler.add_callback(Plain(), before=Second)


def test_duplicate_class_warns_and_pop_remove_by_class_or_instance(caplog):
    first = First()
    handler = CallbackHandler([first, Second()])
    with caplog.at_level("WARNING", logger="hf_callbacks_plus"):
        handler.add_callback(First)
    assert "already one" in caplog.text and "First" in caplog.text
    assert handler.pop_callback(first) is first
    popped = handler.pop_callback(First)
    assert isinstance(popped, First) and popped is not first
    handler.remove_callback(Second)
    assert handler.callbacks == [] and handler.pop_callback(First) is None


def test_custom_events_skip_callbacks_without_the_method():
    class Custom(TrainerCallback):
        def __init__(self):
            self.calls = []

        def on_anything(self, args, state, control, value=None, **kwargs):
            self.calls.append(value)
            control.should_log = True

    custom = Custom()
    handler = CallbackHandler([First(), custom, Second()])
    control = handler.call_event("on_anything", None, TrainerState(), TrainerControl(), value=7)
    assert custom.calls == [7] and control.should_log
    assert handler.listens("on_anything") and not handler.listens("on_nothing")
