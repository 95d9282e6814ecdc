"""The ranking of KeepBestCheckpoints, tested directly (no trainer, no disk): a table of cases,
then a property: admitting candidates one at a time keeps exactly the top k over everything
admitted, computed independently by sorting the whole history."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_callbacks_plus.callbacks.best_checkpoints.ranking import Kept, TopK, admit, rankings, top_k

NAN, INF = math.nan, math.inf
LOSS, ACC = TopK("eval_loss", 2, "min"), TopK("eval_accuracy", 1, "max")


def run(values_by_step, specs):
    """Admit each (step, values) in order; the kept steps and every eviction."""
    entries, evicted = (), []
    for step, values in values_by_step:
        admission = admit(entries, Kept(step, values), specs)
        entries = admission.kept
        evicted += [entry.step for entry in admission.evicted]
    return [entry.step for entry in entries], evicted


def at(loss=None, acc=None, **other):
    """The values of one step: ``eval_loss`` and ``eval_accuracy`` when given."""
    values = {"eval_loss": loss, "eval_accuracy": acc, **other}
    return {name: value for name, value in values.items() if value is not None}


# (history: [(step, values)], rankings, kept steps, evicted steps)
CASES = {
    "the k lowest in min mode": ([(1, at(3.0)), (2, at(1.0)), (3, at(2.0))], [LOSS], [2, 3], [1]),
    "the highest in max mode": ([(1, at(acc=0.5)), (2, at(acc=0.7)), (3, at(acc=0.6))], [ACC], [2], [1]),
    "a tie keeps the earlier step": ([(1, at(1.0)), (2, at(2.0)), (3, at(1.0))], [LOSS], [1, 3], [2]),
    "a tie with the k-th keeps the k-th": ([(1, at(1.0)), (2, at(2.0)), (3, at(2.0))], [LOSS], [1, 2], []),
    "NaN never ranks": ([(1, at(NAN)), (2, at(5.0))], [LOSS], [2], []),
    "+Inf ranks first in max mode": ([(1, at(acc=0.5)), (2, at(acc=INF)), (3, at(acc=0.9))], [ACC], [2], [1]),
    "-Inf ranks first in min mode": ([(1, at(1.0)), (2, at(-INF)), (3, at(0.5))], [LOSS], [2, 3], [1]),
    "a second +Inf ties with the first": ([(1, at(acc=INF)), (2, at(acc=INF))], [ACC], [1], []),
    "+Inf never ranks in min mode": ([(1, at(INF)), (2, at(5.0))], [LOSS], [2], []),
    "-Inf never ranks in max mode": ([(1, at(acc=-INF)), (2, at(acc=0.1))], [TopK("eval_accuracy", 2, "max")],
                                     [2], []),
    "a step without the metric is not kept": ([(1, at(other=1.0)), (2, at(5.0))], [LOSS], [2], []),
    "kept while any ranking keeps it": ([(1, at(1.0, 0.1)), (2, at(9.0, 0.9)), (3, at(2.0, 0.2))],
                                        [LOSS, ACC], [1, 2, 3], []),
    "evicted once no ranking keeps it": ([(1, at(3.0, 0.9)), (2, at(2.0, 0.1)), (3, at(1.0, 0.95))],
                                         [LOSS, ACC], [2, 3], [1]),
    "a step saved twice is ranked by its last values": ([(1, at(1.0)), (2, at(2.0)), (1, at(3.0)),
                                                         (3, at(2.5))], [LOSS], [2, 3], [1]),
}


@pytest.mark.parametrize("name", CASES)
def test_ranking_rules(name):
    history, specs, kept, evicted = CASES[name]
    assert run(history, specs) == (kept, evicted)


def test_a_missing_entry_keeps_its_place():
    """A kept checkpoint found deleted stays ranked: nothing worse is promoted silently."""
    entries = (Kept(1, {"eval_loss": 1.0}, missing=True), Kept(2, {"eval_loss": 2.0}))
    admission = admit(entries, Kept(3, {"eval_loss": 3.0}), [LOSS])
    assert [(e.step, e.missing) for e in admission.kept] == [(1, True), (2, False)]
    assert not admission.admitted and not admission.evicted
    admission = admit(admission.kept, Kept(4, {"eval_loss": 0.5}), [LOSS])  # better than both
    assert [(e.step, e.missing) for e in admission.kept] == [(1, True), (4, False)]
    assert [e.step for e in admission.evicted] == [2]


def test_json_round_trip_is_strict_json_and_keeps_infinities():
    import json

    entry = Kept(7, {"eval_loss": NAN, "eval_accuracy": 0.5, "eval_f1": INF, "eval_mse": -INF}, epoch=1.5,
                 missing=True)
    data = json.loads(json.dumps(entry.to_json(), allow_nan=False))
    assert data["values"] == {"eval_loss": None, "eval_accuracy": 0.5, "eval_f1": "inf", "eval_mse": "-inf"}
    back = Kept.from_json(data)
    assert math.isnan(back.values["eval_loss"]) and back.values["eval_accuracy"] == 0.5
    assert (back.values["eval_f1"], back.values["eval_mse"]) == (INF, -INF)
    assert (back.step, back.epoch, back.missing) == (7, 1.5, True)


values = st.one_of(st.sampled_from([NAN, INF, -INF, 0.0, 1.0, 1.0, 2.0]),
                   st.floats(-5, 5, allow_nan=False).map(lambda v: round(v, 1)))
candidate = st.fixed_dictionaries({}, optional={"eval_loss": values, "eval_accuracy": values})


@settings(max_examples=150, derandomize=True, deadline=None)
@given(history=st.lists(candidate, max_size=14), k_loss=st.integers(1, 4), k_acc=st.integers(1, 3))
def test_admitting_one_at_a_time_keeps_the_top_k_of_everything(history, k_loss, k_acc):
    specs = [TopK("eval_loss", k_loss, "min"), TopK("eval_accuracy", k_acc, "max")]
    entries = ()
    for step, values_at_step in enumerate(history, start=1):
        admission = admit(entries, Kept(step, values_at_step), specs)
        assert not {e.step for e in admission.kept} & {e.step for e in admission.evicted}
        after = {e.step for e in admission.kept} | {e.step for e in admission.evicted}
        assert {e.step for e in entries} <= after
        entries = admission.kept
    # the ground truth: sort the whole history, ties by step; a value ranks when it beats the worst
    # infinity under numpy's comparison, as load_best_model_at_end's first comparison does
    expected = {}
    for spec in specs:
        better, worst = (np.less, INF) if spec.mode == "min" else (np.greater, -INF)
        ranked = [(v[spec.monitor], s) for s, v in enumerate(history, start=1)
                  if spec.monitor in v and better(v[spec.monitor], worst)]
        ordered = sorted(ranked, key=lambda pair: (pair[0] if spec.mode == "min" else -pair[0], pair[1]))
        expected[spec.monitor] = [step for _, step in ordered[: spec.k]]
    assert {name: [e.step for e in kept] for name, kept in rankings(entries, specs).items()} == expected
    assert sorted(e.step for e in entries) == sorted({s for steps in expected.values() for s in steps})
    assert len(entries) <= k_loss + k_acc


def test_top_k_orders_best_first():
    entries = [Kept(1, {"eval_loss": 2.0}), Kept(2, {"eval_loss": 1.0}), Kept(3, {"eval_loss": 1.0})]
    assert [e.step for e in top_k(entries, TopK("eval_loss", 3, "min"))] == [2, 3, 1]
    assert [e.step for e in top_k(entries, TopK("eval_loss", 2, "max"))] == [1, 2]
