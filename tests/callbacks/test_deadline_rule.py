"""Deadline's stopping rule, alone: property tests over step, evaluation and save times, deadlines,
schedules and check intervals (a simulated clock, no trainer), then tables of its edges and of the
arguments it parses."""

from __future__ import annotations

import datetime as dt
import math
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hf_callbacks_plus.callbacks.deadline.ending import Ending, EndReason, read_status, write_status
from hf_callbacks_plus.callbacks.deadline.limits import parse_at, parse_duration, process_age, show_seconds
from hf_callbacks_plus.callbacks.deadline.rule import (
    Durations,
    Measurements,
    Schedule,
    plan_boundary,
    plan_stop,
)
from hf_callbacks_plus.callbacks.deadline.signals import signal_names
from hf_callbacks_plus.cli import main as cli

seconds = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)
positive = st.floats(min_value=0.01, max_value=50.0, allow_nan=False)


def simulate(
    true: Durations,
    estimate: Durations,
    schedule: Schedule,
    deadline: float,
    margin: float,
    check_every: int,
    evaluate_before_stop: bool,
):
    """Train on a simulated clock with the rule deciding at every check; return what happened:
    ``(kind, step, end_time, plan, trace)`` with ``kind`` "stop" or "end" (the last step), ``trace``
    the time at each boundary before its tail."""
    t, trace = 0.0, []
    for step in range(1, schedule.max_steps + 1):
        t += true.step
        trace.append(t)
        evaluates, saves = schedule.evaluates(step), schedule.saves(step)
        check = step % check_every == 0 or step == schedule.max_steps
        if check:
            plan = plan_boundary(
                deadline - t - margin,
                step,
                estimate,
                schedule,
                check_every=check_every,
                evaluates_now=evaluates,
                saves_now=saves,
                evaluate_before_stop=evaluate_before_stop,
            )
            if plan.stop:
                t += (true.evaluate if plan.evaluate else 0.0) + true.save
                return ("end" if step == schedule.max_steps else "stop"), step, t, plan, trace
        t += (true.evaluate if evaluates else 0.0) + (true.save if saves else 0.0)
    raise AssertionError("the last step always ends the simulation")


schedules = st.builds(
    Schedule, eval_every=st.integers(0, 7), save_every=st.integers(0, 7), max_steps=st.integers(1, 60)
)


@given(
    true=st.builds(Durations, step=positive, evaluate=seconds, save=seconds),
    schedule=schedules,
    deadline=st.floats(min_value=0.0, max_value=3000.0),
    margin=st.floats(min_value=0.0, max_value=30.0),
    check_every=st.integers(1, 6),
    evaluate_before_stop=st.booleans(),
    shrink=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_stop_saves_before_the_deadline_at_the_last_boundary_where_a_save_fits(
    true, schedule, deadline, margin, check_every, evaluate_before_stop, shrink
):
    # the estimates are the longest durations seen, so the true ones are at most as long
    actual = Durations(
        true.step * (1 - shrink / 2), true.evaluate * (1 - shrink / 3), true.save * (1 - shrink)
    )
    kind, step, end, plan, trace = simulate(
        actual, true, schedule, deadline, margin, check_every, evaluate_before_stop
    )
    limit = deadline - margin
    first_check = min(check_every, schedule.max_steps)
    if kind == "stop":
        if step > first_check:  # an earlier check decided to go on: it kept room for this save
            assert plan.fits and end <= limit + 1e-9
        if plan.fits:
            assert end <= limit + 1e-9
        if plan.evaluate:  # an evaluation before the stop only when it and the save fit
            assert true.evaluate + true.save <= limit - trace[step - 1] + 1e-9
        # the last boundary: going on to the next check and saving there would not have fit
        following = schedule.next_check(step, check_every)
        cost = (
            (true.evaluate if schedule.evaluates(step) else 0)
            + (true.save if schedule.saves(step) else 0)
            + (following - step) * true.step
            + true.save
            + sum(
                (true.evaluate if schedule.evaluates(s) else 0) + (true.save if schedule.saves(s) else 0)
                for s in range(step + 1, following)
            )
        )
        assert trace[step - 1] + cost > limit - 1e-9
    elif step > first_check:  # the run reached its last step, and the check before kept room for its save
        assert plan.fits and end <= limit + 1e-9


def measured_run(
    true,
    prior,
    schedule,
    deadline,
    margin,
    check_every,
    epoch_steps=0,
    evaluate_before_stop=False,
    decide_after_saves=True,
):
    """The callback's events and decisions on a simulated clock, with the estimates it has then: the
    longest duration seen so far of each kind, at least ``prior`` (what a checkpoint brought; 0: never
    measured). Checks at every ``check_every``-th step's end, the last step and each epoch's end (every
    ``epoch_steps`` steps; 0: none) and, with ``decide_after_saves``, right after every save, where a
    stop keeps that checkpoint. Returns ``(step, end, went_on)``: the stop's (or the last) step, when
    its checkpoint was complete, whether a decision went on before it."""
    seen = {"step": prior.step, "evaluate": prior.evaluate, "save": prior.save}

    def measure(kind, value):
        seen[kind] = max(seen[kind], value)

    def decide(
        t, step, *, saved=False, evaluates_now=False, saves_now=False, epoch_ends_here=False, evaluated=False
    ):
        plan = plan_boundary(
            deadline - t - margin,
            step,
            Durations(**seen),
            schedule,
            check_every=check_every,
            evaluates_now=evaluates_now,
            saves_now=saves_now,
            epoch_ends_here=epoch_ends_here,
            saved=saved,
            evaluate_before_stop=evaluate_before_stop and not evaluated,
        )
        if not plan.stop:
            return None
        return t + (true.evaluate + true.save if plan.evaluate else 0.0 if saved else true.save)

    t, went_on, last = 0.0, False, schedule.max_steps
    for step in range(1, last + 1):
        t += true.step
        measure("step", true.step)
        ends_epoch = epoch_steps > 0 and step % epoch_steps == 0
        evaluates, saves = schedule.evaluates(step), schedule.saves(step)
        if step % check_every == 0 or step == last:
            end = decide(t, step, evaluates_now=evaluates, saves_now=saves, epoch_ends_here=ends_epoch)
            if end is not None:
                return step, end, went_on
            went_on = True
        if evaluates:
            t += true.evaluate
            measure("evaluate", true.evaluate)
        if saves:
            t += true.save
            measure("save", true.save)
            if decide_after_saves:
                end = decide(t, step, saved=True, evaluated=evaluates)
                if end is not None:
                    return step, end, went_on
                went_on = True
        if ends_epoch:
            end = decide(t, step, saved=saves and decide_after_saves, evaluated=evaluates)
            if end is not None:
                return step, end, went_on
            went_on = True
    raise AssertionError("the last step always ends the simulation")


def first_save_end(true, schedule):
    """When the first save ends in a run that never stops (the last step's end without a save)."""
    t = 0.0
    for step in range(1, schedule.max_steps + 1):
        t += true.step + (true.evaluate if schedule.evaluates(step) else 0.0)
        if schedule.saves(step):
            return t + true.save
    return t


@given(
    true=st.builds(Durations, step=positive, evaluate=seconds, save=seconds),
    measured=st.sampled_from(["nothing", "steps", "everything"]),
    schedule=schedules,
    offset=st.floats(min_value=-60.0, max_value=120.0),
    slack=st.floats(min_value=0.0, max_value=30.0),
    check_every=st.integers(1, 6),
    epoch_steps=st.integers(0, 12),
    evaluate_before_stop=st.booleans(),
)
def test_a_margin_covering_what_was_never_measured_lands_the_checkpoint_before_the_deadline(
    true, measured, schedule, offset, slack, check_every, epoch_steps, evaluate_before_stop
):
    """Issue 40: first and later saves, saves slower or faster than a step, evaluations before saves,
    checks every k steps, epochs ending anywhere; the deadline around the first save's end. Never
    measured (a first session): the margin covers one save (and one evaluation when the run
    evaluates); everything measured (a resumed run): the margin is kept whole."""
    prior = {"nothing": Durations(), "steps": Durations(step=true.step), "everything": true}[measured]
    evaluates = schedule.eval_every > 0 or evaluate_before_stop
    unmeasured = (0.0 if prior.save else true.save) + (
        true.evaluate if evaluates and not prior.evaluate else 0.0
    )
    margin = unmeasured + slack
    deadline = max(0.0, first_save_end(true, schedule) + offset)
    step, end, went_on = measured_run(
        true, prior, schedule, deadline, margin, check_every, epoch_steps, evaluate_before_stop
    )
    if went_on:  # a decision went on: it left room for the checkpoint that ended the run
        assert end <= deadline - margin + unmeasured + 1e-9, (step, end)


@pytest.mark.parametrize(("after_saves", "stop", "late"), [(False, 11, 0.6), (True, 10, -1.1)])
def test_the_reported_case_a_deadline_within_one_save_after_the_first(after_saves, stop, late):
    """Issue 40's report: saves of 1.6 s (the first after step 10, never measured before), margin 2 s,
    the deadline 1.1 s after the first save's end. Deciding only at step ends, the rule went on at
    step 10 (the save counted as 0) and stopped at step 11, whose save ended 0.6 s after the deadline;
    deciding again right after the save keeps checkpoint-10, complete 1.1 s before it."""
    true = Durations(step=0.1, evaluate=0.0, save=1.6)
    step, end, went_on = measured_run(
        true,
        Durations(),
        Schedule(save_every=10, max_steps=100),
        deadline=3.7,
        margin=2.0,
        check_every=1,
        decide_after_saves=after_saves,
    )
    assert (step, went_on) == (stop, True) and end - 3.7 == pytest.approx(late)


@given(
    durations=st.builds(Durations, step=positive, evaluate=seconds, save=seconds),
    schedule=schedules,
    check_every=st.integers(1, 6),
)
def test_without_a_deadline_training_goes_on_to_its_last_step(durations, schedule, check_every):
    kind, step, _, plan, _ = simulate(durations, durations, schedule, math.inf, 0.0, check_every, False)
    assert (kind, step) == ("end", schedule.max_steps) and plan.fits


@given(
    left=st.floats(min_value=-10, max_value=100),
    durations=st.builds(Durations, step=seconds, evaluate=seconds, save=seconds),
    evaluate=st.booleans(),
)
def test_a_stop_evaluates_only_when_asked_and_both_fit(left, durations, evaluate):
    plan = plan_stop(left, durations, evaluate=evaluate)
    assert plan.stop
    assert plan.evaluate == (evaluate and durations.evaluate + durations.save <= left)
    assert plan.fits == (plan.needed <= left)


SLOW_EVALUATION, SLOW_STEP = (
    Durations(step=1.0, evaluate=5.0, save=2.0),
    Durations(step=4.0, evaluate=1.0, save=2.0),
)


@pytest.mark.parametrize(
    ("left", "durations", "kwargs", "stop", "evaluate"),
    [
        (100.0, SLOW_EVALUATION, {}, False, False),  # room for many steps
        (2.9, SLOW_EVALUATION, {}, True, False),  # a step (1) + a save (2) > 2.9
        (3.0, SLOW_EVALUATION, {}, False, False),  # exactly: go on
        (4.9, SLOW_EVALUATION, {"saves_now": True}, True, False),  # this save + a step + a save = 5
        (7.5, SLOW_EVALUATION, {"evaluates_now": True}, True, True),  # 5 + 1 + 2 > 7.5: stop; 5 + 2 fits
        (6.9, SLOW_EVALUATION, {"evaluates_now": True}, True, False),  # the evaluation would not fit: skipped
        (5.9, SLOW_STEP, {"evaluate_before_stop": True}, True, True),  # asked for before a stop, and it fits
        (5.9, SLOW_STEP, {}, True, False),  # not asked for
        (2.9, SLOW_STEP, {"evaluate_before_stop": True}, True, False),  # asked for, does not fit
        (2.0, SLOW_EVALUATION, {"epoch_ends_here": True}, False, False),  # the next check is the epoch's end
        (2.9, SLOW_EVALUATION, {"check_every": 2}, True, False),  # two steps and a save > 2.9
    ],
)
def test_the_rule_at_one_boundary(left, durations, kwargs, stop, evaluate):
    plan = plan_boundary(left, 4, durations, Schedule(max_steps=100), **kwargs)
    assert (plan.stop, plan.evaluate) == (stop, evaluate)


def test_right_after_a_save_a_stop_keeps_that_checkpoint():
    durations, schedule = Durations(step=1.0, evaluate=5.0, save=2.0), Schedule(max_steps=100)
    plan = plan_boundary(2.9, 4, durations, schedule, saved=True)  # a step and a save (3 s) do not fit
    assert (plan.stop, plan.evaluate, plan.fits, plan.needed, plan.ahead) == (True, False, True, 0.0, 3.0)
    assert plan_boundary(-5.0, 4, durations, schedule, saved=True).fits  # even past the margin: it is written
    assert not plan_boundary(3.0, 4, durations, schedule, saved=True).stop
    # an evaluation asked for before the stop: it and a second save (the evaluation's state) must fit
    asked = plan_boundary(5.9, 4, SLOW_STEP, schedule, saved=True, evaluate_before_stop=True)
    assert (asked.stop, asked.evaluate, asked.needed) == (True, True, 3.0)
    assert plan_stop(6.9, durations, evaluate=True, saved=True) == plan_stop(
        -1, durations, evaluate=False, saved=True, ahead=math.inf
    )
    assert plan_boundary(1e9, 100, durations, schedule, saved=True).needed == 0.0  # the last step, saved


def test_checks_every_k_steps_count_the_steps_and_the_scheduled_saves_between():
    durations = Durations(step=1.0, evaluate=5.0, save=2.0)
    schedule = Schedule(eval_every=0, save_every=3, max_steps=100)
    # from step 4 the next check is 8: steps 5..8 (4 s), the save at step 6 (2 s), then a save (2 s)
    assert not plan_boundary(8.0, 4, durations, schedule, check_every=4).stop
    assert plan_boundary(7.9, 4, durations, schedule, check_every=4).stop
    assert schedule.next_check(4, 4) == 8 and schedule.next_check(98, 4) == 100


def test_the_last_step_always_stops():
    plan = plan_boundary(1e9, 10, Durations(1, 1, 1), Schedule(max_steps=10), evaluates_now=True)
    assert (plan.stop, plan.evaluate) == (True, True)


def test_measurements_keep_the_longest_of_the_last_ones_and_travel_through_a_checkpoint():
    measured = Measurements(keep=3)
    for value in (9.0, 1.0, 2.0, 3.0, -1.0, math.nan):
        measured.add("step", value)
    assert measured.estimate() == Durations(step=3.0, evaluate=0.0, save=0.0)  # 9 fell out, bad ones ignored
    again = Measurements(keep=3)
    again.load({**measured.to_dict(), "unknown": [1.0], "save": ["x", 4]})
    assert again.estimate() == Durations(step=3.0, evaluate=0.0, save=4.0)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("1:00:00", 3600.0),
        ("3:50:00", 13800.0),
        ("2-04:00:00", 187200.0),
        ("1-02:00:00", 93600.0),
        ("1-23:59:59", 172799.0),
        ("72:00:00", 259200.0),
        ("0:59:59", 3599.0),
        ("00:12:00:00", 43200.0),
        (dt.timedelta(minutes=5), 300.0),
        ({"hours": 1, "minutes": 1}, 3660.0),
        (None, None),
    ],
)
def test_durations_are_read_in_every_documented_form(value, seconds):
    assert parse_duration(value, "duration") == seconds


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("4h", ValueError, "'H:MM:SS'"),
        ("10:00", ValueError, "SLURM's --time"),
        (0, ValueError, "positive"),
        (-5, ValueError, "positive"),
        (math.inf, ValueError, "finite"),
        (True, TypeError, "seconds as a number"),
        ([1], TypeError, "got [1]"),
        ({"hour": 1}, TypeError, "hour"),
    ],
)
def test_bad_durations_name_the_argument_and_the_forms(value, error, words):
    with pytest.raises(error, match="budget") as raised:
        parse_duration(value, "budget")
    assert words in str(raised.value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1:75:00", "has 75 minutes"),  # issue 41: was read as 2:15:00
        ("1:00:60", "has 60 seconds"),
        ("1-24:00:00", "has 24 hours"),
        ("01:24:00:00", "has 24 hours"),
        ("00:00:60:00", "has 60 minutes"),
    ],
)
def test_minutes_and_seconds_above_59_are_refused_with_the_form_and_what_was_meant(value, words):
    with pytest.raises(ValueError, match=f"Deadline: duration='{value}' {words}") as raised:
        parse_duration(value, "duration")
    assert "'H:MM:SS', 'D-H:MM:SS' or 'DD:HH:MM:SS' with minutes and seconds from 00 to 59" in str(
        raised.value
    )
    with pytest.raises(ValueError, match=f"budget='{value}'"):
        parse_duration(value, "budget")


def test_absolute_times_and_the_process_age():
    moment = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert parse_at(moment) == moment.timestamp() and parse_at(1e9) == 1e9 and parse_at(None) is None
    with pytest.raises(TypeError, match="at must be"):
        parse_at("tomorrow")
    age = process_age()
    assert age is None or 0 <= age < 24 * 3600
    assert (show_seconds(12.34), show_seconds(3725), show_seconds(math.inf)) == ("12.3 s", "1:02:05", "inf")


@pytest.mark.parametrize(
    ("given", "names"),
    [
        (("SIGTERM", "SIGUSR1"), ("SIGTERM", "SIGUSR1")),
        (["term", "usr2", "SIGTERM"], ("SIGTERM", "SIGUSR2")),
        ([int(signal.SIGUSR1)], ("SIGUSR1",)),
        ("SIGUSR1", ("SIGUSR1",)),
        ((), ()),
        (None, ()),
    ],
)
def test_signal_names(given, names):
    assert signal_names(given) == names


@pytest.mark.parametrize(
    ("given", "error", "words"),
    [
        (["SIGINT"], ValueError, "KeyboardInterrupt"),
        (["SIGKILL"], ValueError, "cannot be caught"),
        (["SIGNOPE"], ValueError, "valid names"),
        ([1.5], TypeError, "1.5"),
        (5.0, TypeError, "signal names"),
    ],
)
def test_bad_signals_are_refused_with_the_choices(given, error, words):
    with pytest.raises(error, match="Deadline: signals") as raised:
        signal_names(given)
    assert words in str(raised.value)


def test_the_status_file_and_its_command(tmp_path, capsys):
    path = tmp_path / "deep" / "status.json"
    assert cli(["stop-status", str(path)]) == 1  # no file yet
    write_status(path, Ending(step=3))
    assert cli(["stop-status", str(path)]) == 1 and "crashed or was killed" in capsys.readouterr().out
    write_status(path, Ending(EndReason.SIGNAL, step=7, signal="SIGUSR1", exit_code=75, message="stopped"))
    assert cli(["stop-status", str(path)]) == 75 and capsys.readouterr().out.strip() == "stopped"
    write_status(path, Ending(EndReason.COMPLETED, step=9, exit_code=0))
    assert read_status(path) == (0, "ended: completed at step 9")
    path.write_text("{not json")
    assert read_status(path)[0] == 1
    assert [reason.resumable for reason in EndReason] == [False, False, False, False, True, True]
