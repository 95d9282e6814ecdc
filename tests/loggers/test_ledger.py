"""The resume/dedupe ledger on its own: what is skipped (held steps, repeats, delivered records)
and what never is (a second value at one step of the current session). No backend, no thread."""

from __future__ import annotations

import pytest

from hf_callbacks_plus.loggers.ledger import StepLedger, plan_batch
from hf_callbacks_plus.loggers.records import LogRecord, ParamsRecord, TagsRecord


def log(step, session=None, summary=None, **metrics):
    return LogRecord(step, 1000 * step, {k: float(v) for k, v in metrics.items()}, summary or {},
                     session=session)


def same(name):
    return name


def planned_points(batch, held=None, **kwargs):
    return [(item.step, item.metrics) for _, item in plan_batch(batch, held or {}, same, False, **kwargs)
            if item is not None]


@pytest.mark.parametrize(
    ("held", "batch", "expected"),
    [
        ({}, [log(1, loss=1), log(2, loss=2)], [(1, {"loss": 1.0}), (2, {"loss": 2.0})]),
        ({"loss": 4}, [log(4, loss=1), log(6, loss=2)], [(6, {"loss": 2.0})]),  # held before: skipped
        ({"loss": 4}, [log(4, loss=1, acc=3)], [(4, {"acc": 3.0})]),  # the boundary is per metric
        ({}, [log(8, loss=1), log(8, loss=1)], [(8, {"loss": 1.0})]),  # an exact repeat
        ({}, [log(8, loss=1), log(8, loss=2)], [(8, {"loss": 1.0}), (8, {"loss": 2.0})]),  # second value kept
        ({}, [log(3, loss=1), log(2, loss=2)], [(3, {"loss": 1.0}), (2, {"loss": 2.0})]),  # order kept
    ],
)
def test_plan_table(held, batch, expected):
    assert planned_points(batch, held, session="now") == expected


def test_records_of_an_earlier_session_make_the_current_one_skip_their_steps():
    earlier = [log(2, session="old", loss=1), log(4, session="old", loss=2)]
    current = [log(4, session="now", loss=9), log(6, session="now", loss=3)]
    replayed: dict = {}
    assert planned_points(earlier + current, session="now", replayed=replayed) == [
        (2, {"loss": 1.0}), (4, {"loss": 2.0}), (6, {"loss": 3.0})]
    assert replayed == {"loss": 4}


def test_summary_as_curves_and_sanitized_names():
    record = log(5, summary={"train_runtime": 1.5, "note": "hi"}, **{"eval@loss": 2})
    ((source, item),) = plan_batch([record], {}, lambda name: name.replace("@", "_"), True)
    assert source is record
    assert item.metrics == {"eval_loss": 2.0, "train_runtime": 1.5} and item.summary == {"note": "hi"}


def test_other_records_pass_through_in_order_and_delivered_ones_are_skipped():
    params, tags = ParamsRecord({"lr": "0.1"}), TagsRecord({"a": "b"})
    done = log(1, loss=1)
    done.sent = True
    out = list(plan_batch([params, done, log(2, loss=2), tags], {}, same, False))
    assert [source for source, _ in out] == [params, out[1][0], tags]
    assert out[0][1] is None and out[1][1].step == 2 and out[2][1] is None


def test_ledger_boundary_checkpoint_and_delivery():
    ledger = StepLedger()
    ledger.new_session("run-1")
    ledger.restore({"loss": 4})  # from the checkpoint
    ledger.fix_boundary({"loss": 2, "acc": 6})  # what the run reports
    assert ledger.boundary_ready and ledger.last_steps() == {"loss": 4, "acc": 6}
    record = log(6, loss=1, acc=2)
    ((source, item),) = ledger.plan([record], same, False)
    assert item.metrics == {"loss": 1.0}  # acc at 6 was held
    ledger.delivered(source, item)
    assert record.sent and ledger.last_steps() == {"loss": 6, "acc": 6}
    assert ledger.plan([record], same, False) == []  # delivered: a retry does not resend it
    again = log(6, loss=1)
    assert ledger.plan([again], same, False) == []  # the same point: a repeat
    ledger.new_session(None)
    assert ledger.run_id is None and ledger.last_steps() == {} and not ledger.boundary_ready
