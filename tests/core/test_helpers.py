"""The small helpers every callback shares: argument checks (one message shape), the method wrapper
(once per owner, no reference cycle), and the one reader of saved callback states."""

from __future__ import annotations

import gc
import weakref

import pytest

from hf_callbacks_plus.core.checks import (
    check_bool,
    check_choice,
    check_int,
    check_name,
    check_names,
    check_number,
)
from hf_callbacks_plus.core.state import TrainerState, callback_states, saved_attributes, saved_states
from hf_callbacks_plus.core.wrapping import wrap_method


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: check_bool("A", "strict", 1), TypeError, "A: strict must be True or False, got 1."),
    (lambda: check_choice("A", "mode", "up", ("min", "max")), ValueError,
     "A: mode must be one of ['min', 'max'], got 'up'."),
    (lambda: check_int("A", "k", True, minimum=1, meaning="how many"), TypeError,
     "A: k must be an int >= 1 (how many), got True (bool)."),
    (lambda: check_int("A", "k", 0, minimum=1), ValueError, "A: k must be an int >= 1, got 0."),
    (lambda: check_int("A", "seed", 1.5), TypeError, "A: seed must be an int, got 1.5 (float)."),
    (lambda: check_number("A", "baseline", "1", allow_none=True), TypeError,
     "A: baseline must be a number or None, got '1' (str)."),
    (lambda: check_number("A", "x", float("nan")), ValueError, "A: x must be finite, got nan."),
    (lambda: check_number("A", "x", -1, minimum=0), ValueError, "A: x must be >= 0, got -1."),
    (lambda: check_name("A", "monitor", "", example="eval_loss", none="the default"), TypeError,
     "A: monitor must be a non-empty string (e.g. 'eval_loss') or None (the default), got ''."),
    (lambda: check_name("A", "monitor", None), TypeError, "A: monitor must be a non-empty string, got None."),
    (lambda: check_names("A", "metrics", "accuracy"), TypeError,
     "A: metrics must be a list of non-empty strings, got 'accuracy'; did you mean ['accuracy']?"),
    (lambda: check_names("A", "metrics", ["a", ""], "a list of names"), TypeError,
     "A: metrics must be a list of names, got ['a', '']."),
])
def test_each_check_names_the_argument_the_value_and_what_is_valid(call, error, message):
    with pytest.raises(error) as raised:
        call()
    assert str(raised.value) == message


def test_valid_values_pass_through():
    assert check_bool("A", "x", False) is False and check_choice("A", "x", "min", ["min"]) == "min"
    assert check_int("A", "x", 3, minimum=0) == 3 and check_number("A", "x", 2) == 2.0
    assert check_number("A", "x", None, allow_none=True) is None
    assert check_name("A", "x", None, none="default") is None
    assert check_names("A", "x", ("a", "b")) == ("a", "b")


class Target:
    def method(self, value):
        return ("method", value)


def test_a_method_is_wrapped_once_per_owner_and_calls_what_it_had():
    target, calls = Target(), []

    def wrap(call):
        def wrapper(value):
            calls.append(value)
            return call(value)
        return wrapper

    assert wrap_method(target, "method", wrap, marker="_m") is True
    assert wrap_method(target, "method", wrap, marker="_m") is False  # once
    assert target.method(1) == ("method", 1) and calls == [1]
    assert wrap_method(target, "method", wrap, marker="_m", owner="other") is True  # another owner: on top
    assert target.method(2) == ("method", 2) and calls == [1, 2, 2]
    assert wrap_method(target, "missing", wrap, marker="_m") is False  # nothing callable to wrap


def test_the_wrapper_holds_its_target_weakly_and_keeps_a_callable_set_on_the_instance():
    target = Target()
    wrap_method(target, "method", lambda call: call, marker="_m")
    reference = weakref.ref(target)
    gc.disable()
    try:
        del target  # no reference cycle through the wrapper: freed without the collector
        assert reference() is None
    finally:
        gc.enable()
    holder = Target()
    holder.method = lambda value: ("instance", value)
    wrap_method(holder, "method", lambda call: lambda value: call(value), marker="_m")
    assert holder.method(3) == ("instance", 3)


class Keeper:
    def __init__(self, key, value):
        self.key, self.value = key, value

    def state(self):
        return {"args": {}, "attributes": {"state_key": self.key, "value": self.value}}


def test_saved_states_read_every_layout_and_the_last_entry_of_a_key_wins():
    """One instance (a dict), several (a list, with transformers' stale appended entries), from a
    TrainerState, a trainer_state.json dict or the stateful_callbacks dict itself; junk is skipped."""
    saved = callback_states([Keeper("a", 1), Keeper("b", 2)])
    saved["Keeper"].append(Keeper("a", 3).state())  # transformers appends at each save
    saved["Keeper"].append("junk")
    for source in (saved, {"stateful_callbacks": saved}, TrainerState(stateful_callbacks=saved)):
        assert [entry["attributes"]["value"] for entry in saved_states(source, "Keeper")] == [1, 2, 3]
        assert saved_attributes(source, "Keeper", "a")["value"] == 3
        assert saved_attributes(source, "Keeper", "c") is None and saved_states(source, "Other") == []
    single = callback_states([Keeper("a", 1)])
    assert saved_attributes(single, "Keeper", "a") == {"state_key": "a", "value": 1}
    assert saved_states(TrainerState(), "Keeper") == [] and saved_states(None, "Keeper") == []
