"""transformers' callback dispatch semantics, side by side: a stock ``transformers.Trainer``,
``TrainerPlus``, a stock Trainer wired with ``run_before_integrations`` and ``LightweightTrainer``.

User test suites rely on these behaviours of transformers' ``CallbackHandler``: a
``unittest.mock`` callback receives every event, a method patched between two ``train()``
calls is called, a callback added or removed inside an event takes effect as the live list
is walked, and passing ``model=`` twice is a ``TypeError``. Each test runs the same thing in
every runner and compares with the stock Trainer (run by `make compat` too).
"""

from __future__ import annotations

from typing import Any, Callable
from unittest import mock

import pytest

pytest.importorskip("transformers")

from transformers import TrainerCallback as TransformersCallback  # noqa: E402
from transformers.trainer_callback import CallbackHandler as TransformersHandler  # noqa: E402

from hf_callbacks_plus.core.callback import EVENTS, TrainerCallback  # noqa: E402
from hf_callbacks_plus.integrations.ordering import run_before_integrations  # noqa: E402
from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from tests.loop.parity import run_lightweight  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

ARGS = {"max_steps": 4, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 2}


def stock(tmp_path, callbacks):
    return make_trainer(tmp_path / "stock", callbacks=callbacks, **ARGS)


def plus(tmp_path, callbacks):
    return make_trainer(tmp_path / "plus", callbacks=callbacks, trainer_class=TrainerPlus, **ARGS)


def wired(tmp_path, callbacks):
    trainer = make_trainer(tmp_path / "wired", callbacks=callbacks, **ARGS)
    run_before_integrations(trainer, *callbacks)
    return trainer


RUNNERS: dict[str, Callable[..., Any]] = {"TrainerPlus": plus, "run_before_integrations": wired}


#: The events of the installed transformers (4.41 has no on_pre_optimizer_step/on_optimizer_step).
STOCK_EVENTS = [event for event in EVENTS if hasattr(TransformersCallback, event)]


def quiet_mock(**kwargs: Any) -> mock.MagicMock:
    """A mock callback whose events return None (as a real callback that keeps ``control``)."""
    callback = mock.MagicMock(**kwargs)
    for event in STOCK_EVENTS:
        getattr(callback, event).return_value = None
    return callback


def standard_calls(callback: mock.Mock) -> list[str]:
    return [name for name, _, _ in callback.method_calls if name in STOCK_EVENTS]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("spec", [None, TransformersCallback], ids=["MagicMock", "spec=TrainerCallback"])
def test_a_mock_callback_receives_every_event_as_in_the_stock_trainer(tmp_path, runner, spec):
    reference = quiet_mock(spec=spec)
    stock(tmp_path, [reference]).train()
    callback = quiet_mock(spec=spec)
    RUNNERS[runner](tmp_path, [callback]).train()
    assert standard_calls(reference)  # the stock Trainer calls it
    assert standard_calls(callback) == standard_calls(reference)


def test_a_mock_callback_receives_every_event_in_the_loop(tmp_path):
    from hf_callbacks_plus._compat import transformers_version

    if transformers_version() < (4, 57):
        pytest.skip("the loop fires transformers 5.x's events in 5.x's order (docs/loop.md lists what "
                    "older releases order differently); compared with transformers >= 4.57")
    reference = quiet_mock()
    stock(tmp_path, [reference]).train()
    callback = quiet_mock()
    run_lightweight(tmp_path / "loop", callbacks=[callback], **ARGS)
    # on_init_end fires in the trainer's __init__ in both; the loop has no hub push
    assert standard_calls(callback) == standard_calls(reference)


class Counting(TrainerCallback):
    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def patched_after_first_train(trainer: Any) -> tuple[int, int]:
    callback = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, Counting))
    trainer.train()
    with mock.patch.object(callback, "on_log", return_value=None) as on_log, \
            mock.patch.object(callback, "on_step_end", return_value=None) as step:
        trainer.train()
    return on_log.call_count, step.call_count


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_a_method_patched_after_the_first_train_is_called(tmp_path, runner):
    expected = patched_after_first_train(stock(tmp_path, [Counting()]))
    assert expected[0] > 0 and expected[1] == ARGS["max_steps"]
    assert patched_after_first_train(RUNNERS[runner](tmp_path, [Counting()])) == expected


def test_a_method_patched_after_the_first_train_is_called_in_the_loop(tmp_path):
    expected = patched_after_first_train(stock(tmp_path, [Counting()]))
    recorder, trainer = run_lightweight(tmp_path / "loop", callbacks=[Counting()], **ARGS)
    callback = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, Counting))
    with mock.patch.object(callback, "on_log", return_value=None) as on_log, \
            mock.patch.object(callback, "on_step_end", return_value=None) as step:
        trainer.train()
    assert (on_log.call_count, step.call_count) == expected


class Late(TrainerCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(("on_step_end", state.global_step))

    def on_log(self, args, state, control, **kwargs):
        self.events.append(("on_log", state.global_step))


class AddsAndRemoves(TrainerCallback):
    """At step 2: adds ``late`` and removes ``doomed`` from the live list, inside on_step_end."""

    def __init__(self, late: Late, doomed: Late) -> None:
        self.late, self.doomed, self.handler = late, doomed, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            self.handler.callbacks.append(self.late)
            self.handler.callbacks.remove(self.doomed)


def events_with_mid_event_changes(trainer: Any) -> tuple[list, list]:
    late, doomed = Late(), Late()
    changer = AddsAndRemoves(late, doomed)
    changer.handler = trainer.callback_handler
    trainer.callback_handler.callbacks[1:1] = [changer, doomed]
    trainer.train()
    return late.events, doomed.events


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_callbacks_added_or_removed_inside_an_event_as_in_the_stock_trainer(tmp_path, runner):
    expected = events_with_mid_event_changes(stock(tmp_path, []))
    assert ("on_step_end", 2) in expected[0] and ("on_step_end", 2) not in expected[1]
    assert events_with_mid_event_changes(RUNNERS[runner](tmp_path, [])) == expected


def test_callbacks_added_or_removed_inside_an_event_in_the_loop(tmp_path):
    expected = events_with_mid_event_changes(stock(tmp_path, []))
    late, doomed = Late(), Late()
    changer = AddsAndRemoves(late, doomed)

    def setup(loop: Any) -> None:
        changer.handler = loop.callback_handler
        loop.callback_handler.callbacks[1:1] = [changer, doomed]

    run_lightweight(tmp_path / "loop", setup=setup, **ARGS)
    assert (late.events, doomed.events) == expected


@pytest.mark.parametrize("runner", ["stock", *sorted(RUNNERS)])
def test_passing_model_twice_raises_type_error(tmp_path, runner):
    trainer = stock(tmp_path, []) if runner == "stock" else RUNNERS[runner](tmp_path, [])
    handler = trainer.callback_handler
    with pytest.raises(TypeError, match="model"):
        handler.call_event("on_log", trainer.args, trainer.state, trainer.control, model=object(), logs={})


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_the_handler_is_a_transformers_callback_handler(tmp_path, runner):
    assert isinstance(RUNNERS[runner](tmp_path, []).callback_handler, TransformersHandler)
