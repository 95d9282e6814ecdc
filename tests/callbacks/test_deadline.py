"""Deadline in one process: a real signal (``os.kill``) at a chosen moment of a real training stops it
at the next step boundary with one complete checkpoint, and the resumed training ends bit-identical
to an uninterrupted one (weights, ``log_history``, the JSONL tracker's curves); deadlines with an
injected slow save (a simulated clock); the final evaluation; the budget across resumes; the errors.

Wirings: a stock ``transformers.Trainer`` (binds nothing: the loss logged at the first logging step
after the resume covers only the resumed steps, as after any transformers resume), the same with
``run_before_integrations``, ``TrainerPlus`` and ``LightweightTrainer``.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hf_callbacks_plus import (  # noqa: E402
    Deadline,
    EarlyStopping,
    JsonlLogger,
    KeepBestCheckpoints,
    LightweightTrainer,
    LoopArguments,
    TrainerPlus,
    run_before_integrations,
)
from hf_callbacks_plus.callbacks.deadline.ending import read_status  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from tests.callbacks.deadline_helpers import (  # noqa: E402
    ARGS,
    MOMENTS,
    SignalAt,
    SimulatedClock,
    SimulatedCosts,
    comparable,
    complete,
    jsonl_points,
    same_weights,
    stop_step,
)
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.transformers]

WIRINGS = ("stock", "run_before_integrations", "TrainerPlus")


def build(wiring: str, output_dir: Path, callbacks: list, **overrides):
    """A trainer on the tiny regression task, wired as ``wiring``."""
    args = {**ARGS, **overrides}
    trainer_class = TrainerPlus if wiring == "TrainerPlus" else None
    trainer = make_trainer(output_dir, callbacks=callbacks, trainer_class=trainer_class, **args)
    if wiring == "run_before_integrations":
        run_before_integrations(trainer, *[cb for cb in callbacks if isinstance(cb, Deadline)])
    return trainer


class Saves(TrainerCallback):
    """Records the step of every save."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_save(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


_REFERENCES: dict[str, object] = {}


@pytest.fixture
def reference(tmp_path_factory):
    """The uninterrupted run of a wiring (with Deadline and a JSONL logger), trained once per module."""

    def get(wiring: str):
        if wiring not in _REFERENCES:
            out = tmp_path_factory.mktemp(f"reference-{wiring}")
            trainer = build(wiring, out, [Deadline(margin=0), JsonlLogger()])
            trainer.train()
            _REFERENCES[wiring] = trainer
        return _REFERENCES[wiring]

    return get


def stop_then_resume(wiring: str, out: Path, gate: SignalAt, **deadline_args):
    """Train until the gate's signal stops the run, then resume a new trainer to the end."""
    deadline = Deadline(margin=0, status_file=out / "status.json", **deadline_args)
    saves = Saves()
    stopped = build(wiring, out, [deadline, gate, saves, JsonlLogger()])
    stopped.train()
    assert read_status(out / "status.json")[0] == deadline.exit_code
    resumed = build(
        wiring, out, [Deadline(margin=0, status_file=out / "status.json", **deadline_args), JsonlLogger()]
    )
    resumed.train(resume_from_checkpoint=True)
    return stopped, deadline, saves, resumed


@pytest.mark.parametrize(
    "wiring",
    [
        pytest.param(wiring, marks=[pytest.mark.second_tier] if wiring == "run_before_integrations" else [])
        for wiring in WIRINGS
    ],  # run_before_integrations: in the first tier on 2 ranks (distributed)
)
def test_a_signal_inside_a_step_stops_there_and_the_resume_ends_like_an_uninterrupted_run(
    wiring, tmp_path, reference, capsys
):
    out = tmp_path / "run"
    previous = signal.getsignal(signal.SIGUSR1)
    stopped, deadline, saves, resumed = stop_then_resume(wiring, out, SignalAt(7, "step"))

    # one save, of step 7, complete; the end told, recorded and reported
    assert stopped.state.global_step == 7 and saves.steps == [7]
    assert complete(out / "checkpoint-7")
    assert deadline.exit_code == 75 and deadline.ending.label == "SIGUSR1"
    assert read_status(out / "status.json")[0] == 0  # the resumed run ended complete (same file)
    err = capsys.readouterr().err
    assert (
        err.count("Deadline: SIGUSR1 received") == 1 and "stopping after step 7: saving checkpoint-7" in err
    )
    assert "Deadline summary: stopped at step 7 of 16 on SIGUSR1; checkpoint-7 complete" in err
    ends = [
        json_line
        for json_line in (out / "metrics.jsonl").read_text().splitlines()
        if "deadline/reason" in json_line
    ]
    assert len(ends) == 2 and '"SIGUSR1"' in ends[0] and '"completed"' in ends[1]
    assert signal.getsignal(signal.SIGUSR1) is previous  # put back at train end

    # the resumed run ends as the uninterrupted one
    ref = reference(wiring)
    assert same_weights(resumed.model, ref.model)
    ours, theirs = comparable(resumed.state.log_history), comparable(ref.state.log_history)
    points, ref_points = (
        jsonl_points(out / "metrics.jsonl"),
        jsonl_points(Path(ref.args.output_dir) / "metrics.jsonl"),
    )
    if (
        wiring == "stock"
    ):  # no trainer bound: the loss at step 9 averages steps 8-9 only (transformers' resume)
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        assert [ours[i]["step"] for i in differ] == [9] and ours[differ[0]]["loss"] != theirs[differ[0]][
            "loss"
        ]
        assert {k for k in points if points[k] != ref_points.get(k)} == {("train/loss", 9)}
    else:  # the logging window of steps 7-8 travelled in checkpoint-7
        assert ours == theirs
        assert points == ref_points


@pytest.mark.parametrize(
    ("moment", "step", "stops", "saved"),
    [
        # during the evaluation after step 4: the next step's end (first tier: on 2 ranks, distributed)
        pytest.param("evaluation", 4, 5, [5], marks=pytest.mark.second_tier),
        ("save", 8, 8, [8]),  # during the save of step 8, which ends the epoch: the epoch's end, no 2nd save
    ],
)
def test_a_signal_during_an_evaluation_or_a_save_stops_at_the_next_boundary(
    moment, step, stops, saved, tmp_path, reference
):
    out = tmp_path / "run"
    stopped, deadline, saves, resumed = stop_then_resume("TrainerPlus", out, SignalAt(step, moment))
    assert stopped.state.global_step == stops == stop_step(step, moment, steps_per_epoch=8)
    assert saves.steps == saved and complete(out / f"checkpoint-{stops}")
    assert deadline.ending.checkpoint == str(out / f"checkpoint-{stops}")
    ref = reference("TrainerPlus")
    assert same_weights(resumed.model, ref.model)
    assert comparable(resumed.state.log_history) == comparable(ref.state.log_history)


@pytest.mark.second_tier  # the first tier stops after a save on a deadline (below) and at an epoch's end
def test_a_signal_during_a_save_keeps_that_checkpoint_and_the_resume_ends_like_an_uninterrupted_run(
    tmp_path, reference
):
    """Saves every 6 steps (not an epoch's end): a signal inside the save of step 6 stops right after
    it, with no second save (before: after step 7, saving again)."""
    out = tmp_path / "run"
    deadline, saves = Deadline(margin=0, status_file=out / "status.json"), Saves()
    stopped = build("TrainerPlus", out, [deadline, SignalAt(6, "save"), saves, JsonlLogger()], save_steps=6)
    stopped.train()
    assert (stopped.state.global_step, saves.steps, deadline.exit_code) == (6, [6], 75)
    assert complete(out / "checkpoint-6") and deadline.signal_to_checkpoint is not None
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["Deadline"]["attributes"]["reason"] == "signal"
    resumed = build("TrainerPlus", out, [Deadline(margin=0), JsonlLogger()], save_steps=6)
    resumed.train(resume_from_checkpoint=True)
    ref = reference("TrainerPlus")
    assert same_weights(resumed.model, ref.model)
    assert comparable(resumed.state.log_history) == comparable(ref.state.log_history)
    assert jsonl_points(out / "metrics.jsonl") == jsonl_points(Path(ref.args.output_dir) / "metrics.jsonl")


def lightweight(out: Path, callbacks: list, batches_per_epoch: int = 6, eval_data: bool = True, **overrides):
    """A ``LightweightTrainer`` on the tiny regression task: 14 steps, a log every 4, an evaluation every 5
    (``overrides`` change the ``LoopArguments``)."""
    import torch

    from tests.tiny_models import RegressionDataset, TinyRegressionModel

    torch.manual_seed(0)
    model = TinyRegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = RegressionDataset(8 * batches_per_epoch, seed=1)
    batches = [(data.x[i : i + 8], data.y[i : i + 8]) for i in range(0, 8 * batches_per_epoch, 8)]

    def train_step(batch):
        loss = model(batch[0], batch[1])["loss"]
        loss.backward()
        return loss.item()

    def eval_step(batch):
        with torch.no_grad():
            return model(batch[0], batch[1])["loss"].item()

    args = {
        "max_steps": 14,
        "logging_steps": 4,
        "eval_strategy": "steps",
        "eval_steps": 5,
        "save_strategy": "steps",
        "save_steps": 100,
        **overrides,
    }
    return LightweightTrainer(
        LoopArguments(output_dir=str(out), disable_tqdm=True, **args),
        train_step=train_step,
        train_data=batches,
        eval_data=batches[:2] if eval_data else None,
        eval_step=eval_step if eval_data else None,
        callbacks=callbacks,
        model=model,
        optimizer=optimizer,
    )


def test_lightweight_trainer_same_semantics(tmp_path):
    out = tmp_path / "run"
    deadline, saves = Deadline(margin=0), Saves()
    stopped = lightweight(out, [deadline, SignalAt(6, "step", signal.SIGTERM), saves])
    stopped.train()
    assert (stopped.state.global_step, saves.steps, deadline.exit_code) == (6, [6], 75)
    resumed = lightweight(out, [Deadline(margin=0)])
    resumed.train(resume_from_checkpoint=True)
    ref = lightweight(tmp_path / "ref", [Deadline(margin=0)])
    ref.train()
    assert same_weights(resumed.model, ref.model)
    assert comparable(resumed.state.log_history) == comparable(ref.state.log_history)


def slow_save_run(out: Path, clock: SimulatedClock, callbacks: list, **deadline_args):
    costs = SimulatedCosts(clock, step=1.0, evaluation=3.0, save=10.0)  # the injected slow save
    deadline = Deadline(**{"signals": (), **deadline_args})
    deadline._clock = clock
    trainer = build("TrainerPlus", out, [costs, deadline, *callbacks], max_steps=40, save_steps=4)
    return trainer, deadline, costs


def test_a_deadline_with_a_slow_save_ends_with_a_complete_checkpoint_before_it(tmp_path):
    clock = SimulatedClock()
    trainer, deadline, costs = slow_save_run(tmp_path, clock, [], budget=60, margin=5)
    start = clock.now
    trainer.train()
    step, end = costs.saves[-1]
    assert (
        trainer.state.global_step == step == deadline.stopped_step == 12 and deadline.ending.label == "budget"
    )
    assert complete(tmp_path / f"checkpoint-{step}")
    assert end - start <= 60 - 5  # the stop's evaluation and save ended before the deadline, margin kept
    # the last such boundary: the evaluation and save scheduled there, one more step and a save would not fit
    boundary = dict(costs.boundaries)[step] - start
    assert boundary + (3.0 + 10.0) + 1.0 + 10.0 > 60 - 5
    assert deadline.exit_code == 0  # a spent budget is the end: nothing to requeue


# -- a deadline around a save (issue 40): a simulated clock, the injected slow save ---------------------

#: (step, evaluation, save seconds; save_steps, eval_steps (0: none), check_every, batches per epoch;
#: margin; the deadline: seconds after the end of the n-th save of an uninterrupted run, n)
AFTER_A_SAVE = {
    # the report's case: the first save (never measured) after step 8, the deadline within one save after it
    "first save": (1, 3, 10, 8, 4, 1, 6, 10, 6, 1),
    "a later save (measured)": (1, 3, 10, 8, 4, 1, 6, 10, 5, 2),
    "saves faster than a step": (5, 0, 2, 3, 0, 1, 6, 2, 6, 1),
    # the first evaluation and the first save at one boundary, neither measured: the margin covers both
    "an evaluation before the save": (1, 6, 10, 8, 8, 1, 6, 16, 6, 1),
    "check_every=3 (the save between two checks)": (1, 3, 10, 8, 4, 3, 6, 10, 6, 1),
    "the save ends an epoch": (1, 3, 10, 8, 4, 1, 8, 10, 6, 1),
}


def save_ends(step, evaluation, save, save_steps, eval_steps, max_steps):
    """When each save ends in an uninterrupted run on the simulated clock."""
    t, ends = 0.0, []
    for n in range(1, max_steps + 1):
        t += step + (evaluation if eval_steps and (n % eval_steps == 0 or n == max_steps) else 0)
        if n % save_steps == 0 or n == max_steps:
            t += save
            ends.append(t)
    return ends


def timed_lightweight(out: Path, case: tuple, kind: str = "budget"):
    """A LightweightTrainer on the simulated clock of ``case`` (see AFTER_A_SAVE), stopped by Deadline."""
    step, evaluation, save, save_steps, eval_steps, every, batches, margin, after, nth = case
    clock, saves = SimulatedClock(), Saves()
    costs = SimulatedCosts(clock, step=step, evaluation=evaluation, save=save)
    deadline_in = save_ends(step, evaluation, save, save_steps, eval_steps, 40)[nth - 1] + after
    limit = {"budget": deadline_in} if kind == "budget" else {"at": time.time() + deadline_in}
    deadline = Deadline(signals=(), margin=margin, check_every=every, **limit)
    deadline._clock = clock
    evaluations = (
        {"eval_strategy": "steps", "eval_steps": eval_steps} if eval_steps else {"eval_strategy": "no"}
    )
    trainer = lightweight(
        out,
        [costs, deadline, saves],
        batches_per_epoch=batches,
        max_steps=40,
        save_steps=save_steps,
        **evaluations,
    )
    start = clock.now
    trainer.train()
    return trainer, deadline, costs, saves, deadline_in, start


@pytest.mark.parametrize("case", AFTER_A_SAVE.values(), ids=AFTER_A_SAVE.keys())
def test_a_margin_of_one_save_lands_the_stops_checkpoint_before_the_deadline(case, tmp_path):
    trainer, deadline, costs, saves, deadline_in, start = timed_lightweight(tmp_path, case)
    stop, (last, end) = deadline.stopped_step, costs.saves[-1]
    assert trainer.state.global_step == stop == last and saves.steps.count(stop) == 1  # one save, the stop's
    assert (
        deadline.ending.label == "budget"
        and (tmp_path / f"checkpoint-{stop}" / "trainer_state.json").is_file()
    )
    assert end - start <= deadline_in, f"checkpoint-{stop} complete {end - start - deadline_in} s late"
    step, evaluation, save, save_steps, *_, margin, _, nth = case
    if nth == 1:  # the first save was the last one that fitted: it is the stop's, no second save
        assert saves.steps == [save_steps]
    else:  # everything measured: the margin is kept whole
        assert end - start <= deadline_in - margin


def test_the_stop_after_a_save_on_a_deadline_says_so_and_exits_for_a_requeue(tmp_path, capsys):
    trainer, deadline, costs, saves, deadline_in, start = timed_lightweight(
        tmp_path, AFTER_A_SAVE["first save"], kind="at"
    )
    assert (deadline.stopped_step, saves.steps, deadline.exit_code) == (8, [8], 75)
    assert deadline.ending.checkpoint == str(tmp_path / "checkpoint-8")
    err = capsys.readouterr().err
    # the first save ended at 24, the deadline is at 30, the margin 10: step 9 and a save (11 s) do not fit
    assert (
        "Deadline: the deadline (at) ends in 6.0 s; going on to the next check and saving there (~11.0 s) "
        "would not leave the margin of 10.0 s; stopping after step 8: keeping checkpoint-8, just saved."
    ) in err
    assert "checkpoint-8 complete (saved just before the decision)" in err


def test_evaluate_before_stop_right_after_a_save_evaluates_then_saves_again(tmp_path):
    """A stop decided right after step 8's save (its first: going on counted it as 0) with
    ``evaluate_before_stop``: slow steps (5 s), so the evaluation (1 s) and a second save (10 s) fit where
    another step and a save (15 s) do not."""
    clock, saves = SimulatedClock(), Saves()
    costs = SimulatedCosts(clock, step=5, evaluation=1, save=10)
    deadline = Deadline(
        signals=(), margin=10, budget=74, evaluate_before_stop=True
    )  # 13 s left after the save
    deadline._clock = clock
    trainer = lightweight(tmp_path, [costs, deadline, saves], max_steps=40, save_steps=8, eval_steps=5)
    trainer.train()
    evaluated = [record["step"] for record in trainer.state.log_history if "eval_loss" in record]
    assert (deadline.stopped_step, saves.steps, evaluated) == (8, [8, 8], [5, 8])
    assert costs.saves[-1][1] - 1000 <= 74 - 10 and deadline.ending.checkpoint == str(
        tmp_path / "checkpoint-8"
    )
    state = json.loads((tmp_path / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["Deadline"]["attributes"]["stopped_step"] == 8
    assert [r["step"] for r in state["log_history"] if "eval_loss" in r] == [5, 8]  # the second save has it


@pytest.mark.parametrize(
    ("grace", "words"),
    [
        (30, "saving checkpoint-5 (~10.0 s, 29.0 s before the end of the grace period: into the margin of"),
        (5, "saving checkpoint-5 (~10.0 s, 4.0 s before the end of the grace period: it may end after it)"),
        (100, "saving checkpoint-5."),
    ],
)
def test_the_stop_line_tells_whether_the_save_eats_into_the_margin_or_may_end_late(
    grace, words, tmp_path, capsys
):
    """Issue 40: the line said "it may not end before the deadline: it came sooner than one save" with
    3.1 s left for a 1.6 s save. A signal inside step 5 (1 s after it came), the save measured at step 3
    (10 s), a margin of 25 s."""
    clock = SimulatedClock()
    costs = SimulatedCosts(clock, step=1, evaluation=0, save=10)
    deadline = Deadline(signals=("SIGUSR1",), margin=25, grace=grace)
    deadline._clock = clock
    trainer = lightweight(tmp_path, [SignalAt(5, "step"), costs, deadline], save_steps=3, eval_strategy="no")
    trainer.train()
    assert deadline.stopped_step == 5
    assert f"Deadline: SIGUSR1 received 1.0 s ago; stopping after step 5: {words}" in capsys.readouterr().err


def test_a_stock_trainer_with_a_slow_first_save_keeps_it_as_the_stops_checkpoint(tmp_path):
    """The report's wiring in one process: a stock Trainer, Deadline in ``callbacks=`` only."""
    clock, saves = SimulatedClock(), Saves()
    costs = SimulatedCosts(clock, step=1.0, evaluation=3.0, save=10.0)
    # the first save (step 6) ends at 22: the deadline at 28
    deadline_in = save_ends(1, 3, 10, 6, 3, 16)[0] + 6
    deadline = Deadline(signals=(), margin=10, budget=deadline_in)
    deadline._clock = clock
    trainer = build("stock", tmp_path, [costs, deadline, saves], eval_steps=3, save_steps=6)
    start = clock.now
    trainer.train()
    assert (trainer.state.global_step, saves.steps, deadline.stopped_step) == (6, [6], 6)
    assert costs.saves[-1][1] - start <= deadline_in and complete(tmp_path / "checkpoint-6")
    stopped = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert stopped["stateful_callbacks"]["Deadline"]["attributes"]["stopped_step"] == 6  # the stop's state


def test_the_budget_counts_on_across_resumes(tmp_path):
    clock = SimulatedClock()
    first, deadline, _ = slow_save_run(
        tmp_path, clock, [SignalAt(6, "step")], budget=60, margin=5, signals=("SIGUSR1",)
    )
    first.train()
    assert (first.state.global_step, deadline.exit_code) == (6, 75)
    # checkpoint-6 counts the training up to its state, written inside its save: 6 steps, an evaluation
    # and a save at step 4 (1 * 6 + 3 + 10), not the 10 s of its own save
    used = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert used["stateful_callbacks"]["Deadline"]["attributes"]["elapsed"] == 19.0
    clock.advance(3600)  # the job waits in the queue: not training time
    second, deadline2, costs = slow_save_run(tmp_path, clock, [], budget=60, margin=5)
    start = clock.now
    second.train(resume_from_checkpoint=True)
    assert deadline2.ending.label == "budget" and deadline2.exit_code == 0
    assert 19.0 + (costs.saves[-1][1] - start) <= 60 - 5
    third, deadline3, _ = slow_save_run(tmp_path, clock, [], budget=60, margin=5)
    output = third.train(resume_from_checkpoint=True)  # TrainerPlus: vetoed before any step
    assert output.metrics.get("train_skipped") == 1.0 and third.state.global_step == second.state.global_step
    assert deadline3.exit_code == 0 and deadline3.ending.label == "budget"


def test_evaluate_before_a_signal_stop_lets_early_stopping_and_the_kept_checkpoints_rank_it(tmp_path):
    out = tmp_path / "run"
    stopper, keeper = EarlyStopping("eval_loss", patience=5), KeepBestCheckpoints("eval_loss", k=2)
    deadline = Deadline(margin=0, grace=1e6, evaluate_before_stop=True)
    trainer = build("TrainerPlus", out, [deadline, SignalAt(7, "step"), stopper, keeper])
    trainer.train()
    evaluated = [r["step"] for r in trainer.state.log_history if "eval_loss" in r]
    assert evaluated == [4, 7] and stopper.best_step == 7
    kept = out / "best_checkpoints"
    assert sorted(p.name for p in kept.glob("checkpoint-*")) == ["checkpoint-7"]  # saved steps only: 7
    resumed_stopper, resumed_keeper = (
        EarlyStopping("eval_loss", patience=5),
        KeepBestCheckpoints("eval_loss", k=2),
    )
    resumed = build("TrainerPlus", out, [Deadline(margin=0), resumed_stopper, resumed_keeper])
    resumed.train(resume_from_checkpoint=True)
    # both went on from their checkpoint-7 state: the loss keeps falling, step 7 drops out of the two best
    assert resumed_stopper.best_step == 16 and resumed_stopper.wait == 0 and resumed.state.global_step == 16
    assert sorted(p.name for p in kept.glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-8"]


class StopAt(TrainerCallback):
    """Another callback stopping the training at ``step`` (as TerminateOnNonFinite does)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


@pytest.mark.parametrize("final", [False, True])
def test_final_evaluation_when_another_callback_stops_between_evaluations(final, tmp_path):
    trainer = build("stock", tmp_path, [StopAt(6), Deadline(final_evaluation=final, signals=["SIGUSR2"])])
    trainer.train()
    evaluated = [r["step"] for r in trainer.state.log_history if "eval_loss" in r]
    assert evaluated == ([4, 6] if final else [4])
    assert (tmp_path / "checkpoint-6").is_dir() == final


def test_jit_checkpoint_on_sigterm_is_refused_and_usr1_only_coexists(tmp_path):
    with pytest.raises(ValueError, match="enable_jit_checkpoint=True.*signals=\\['SIGUSR1'\\]"):
        build("stock", tmp_path, [Deadline()], enable_jit_checkpoint=True)
    trainer = build(
        "stock",
        tmp_path,
        [Deadline(signals=["SIGUSR1"], margin=0), SignalAt(3, "step")],
        enable_jit_checkpoint=True,
    )
    trainer.train()
    assert trainer.state.global_step == 3


def test_misuse_is_refused_early(tmp_path):
    with pytest.raises(ValueError, match="nothing to do"):
        Deadline(signals=())
    with pytest.raises(ValueError, match="check_every must be an integer >= 1, got 0"):
        Deadline(check_every=0)
    with pytest.raises(ValueError, match="requeue_exit_code must be an integer from 1 to 255, got 0"):
        Deadline(requeue_exit_code=0)
    with pytest.raises(ValueError, match="margin must be a number of seconds >= 0, got -1"):
        Deadline(margin=-1)
    with pytest.raises(TypeError, match="final_evaluation must be True or False"):
        Deadline(final_evaluation="yes")
    deadline = Deadline()
    trainer = build("TrainerPlus", tmp_path, [deadline])
    trainer.add_callback(Deadline())
    with pytest.raises(ValueError, match="2 instances share state_key='Deadline'"):
        trainer.train()
    bare = make_trainer(
        tmp_path, callbacks=[Deadline(final_evaluation=True)], trainer_class=TrainerPlus, **ARGS
    )
    bare.eval_dataset = None
    with pytest.raises(ValueError, match="final_evaluation=True but the trainer has nothing to evaluate"):
        bare.train()


@pytest.mark.parametrize("option", ["final_evaluation", "evaluate_before_stop"])
@pytest.mark.parametrize(
    "wiring",
    [
        "stock",
        "LightweightTrainer",
        # bound to the trainer: refused at train begin already (second tier: the wording)
        pytest.param("run_before_integrations", marks=pytest.mark.second_tier),
        pytest.param("TrainerPlus", marks=pytest.mark.second_tier),
    ],
)
def test_an_evaluation_with_nothing_to_evaluate_is_refused_at_train_begin(option, wiring, tmp_path):
    """Issue 41: a stock Trainer with Deadline in ``callbacks=`` only trained every step, then failed in
    the final evaluation without writing the last step's checkpoint (final_evaluation), or trained with
    an option that could only fail at a stop, before its save (evaluate_before_stop). Deadline does not
    know a stock Trainer it was not given (and reads no caller's frame): with ``eval_strategy="no"``
    (otherwise transformers refuses a missing eval dataset at init) it asks for the binding, then the
    bound check names the missing dataset."""
    from transformers import Trainer

    from tests.tiny_models import RegressionDataset, TinyRegressionModel, training_args

    deadline = Deadline(**{option: True})
    if wiring == "LightweightTrainer":
        trainer = lightweight(tmp_path, [deadline], eval_data=False, eval_strategy="no", save_steps=4)
    else:
        trainer = (TrainerPlus if wiring == "TrainerPlus" else Trainer)(
            model=TinyRegressionModel(),
            args=training_args(tmp_path, max_steps=6, save_strategy="steps", save_steps=4),
            train_dataset=RegressionDataset(64, seed=1),
            callbacks=[deadline],
        )
    if wiring == "stock":
        with pytest.raises(ValueError, match=f"{option}=True with eval_strategy='no' in a trainer") as raised:
            trainer.train()
        assert "run_before_integrations(trainer, deadline)" in str(raised.value)
        assert f"Deadline({option}=False)" in str(raised.value)
    if wiring in ("stock", "run_before_integrations"):
        run_before_integrations(trainer, deadline)
    with pytest.raises(ValueError, match=f"{option}=True but the trainer has nothing to evaluate") as raised:
        trainer.train()
    assert "pass eval_dataset=... to the trainer" in str(raised.value)
    assert f"Deadline({option}=False)" in str(raised.value)
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))  # nothing trained


@pytest.mark.parametrize("wiring", ["run_before_integrations", "stock"])
def test_after_a_stock_trainer_raised_a_signal_goes_to_the_previous_handler(wiring, tmp_path):
    """A stock Trainer fires no end event when it raises: bound (run_before_integrations), Deadline put
    a ``train`` of its own on it that puts the handlers back; unbound, the user calls
    ``restore_signal_handlers()`` (documented)."""
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("boom")

    try:
        deadline = Deadline()
        trainer = build(wiring, tmp_path, [deadline, Boom()])
        with pytest.raises(RuntimeError, match="boom"):
            trainer.train()
        if wiring == "stock":
            assert signal.getsignal(signal.SIGUSR1) != previous  # still Deadline's
            deadline.restore_signal_handlers()
        signal.raise_signal(signal.SIGUSR1)
        assert received == [signal.SIGUSR1] and deadline._flag.received is None
    finally:
        signal.signal(signal.SIGUSR1, previous)


# -- second tier: the random-moment matrix ---------------------------------------------------------


def random_cases(seed: int = 34) -> list[tuple[str, str, int, int]]:
    """Every wiring x moment, at a seeded random step, checking every 1 or 3 steps."""
    rng = random.Random(seed)
    steps = {"step": list(range(1, 16)), "evaluation": [4, 8, 12], "save": [8]}
    return [
        (wiring, moment, rng.choice(steps[moment]), rng.choice([1, 3]))
        for wiring in ("stock", "run_before_integrations", "TrainerPlus")
        for moment in MOMENTS
    ]


def expected_stop(moment: str, step: int, every: int) -> int:
    """The first boundary after the signal: a check (multiples of ``every``, the last step, the epoch's
    end at 8 and 16)."""
    if moment != "step" and step % 8 == 0:
        return step  # the epoch's end, right after this step's evaluation and save
    first = step if moment == "step" else step + 1
    return next(s for s in range(first, 17) if s % every == 0 or s % 8 == 0)


@pytest.mark.second_tier
@pytest.mark.parametrize(("wiring", "moment", "step", "every"), random_cases())
def test_random_moments_then_resume(wiring, moment, step, every, tmp_path, reference):
    out = tmp_path / "run"
    stopped, deadline, saves, resumed = stop_then_resume(
        wiring, out, SignalAt(step, moment), check_every=every
    )
    stop = expected_stop(moment, step, every)
    assert (
        stopped.state.global_step == stop
        and saves.steps.count(stop) == 1
        and complete(out / f"checkpoint-{stop}")
    )
    ref = reference(wiring)
    assert same_weights(resumed.model, ref.model)
    ours, theirs = comparable(resumed.state.log_history), comparable(ref.state.log_history)
    if wiring != "stock" or stop % 3 == 0:  # the stock Trainer carries no logging window (see the top)
        assert ours == theirs
    else:
        assert [a["step"] for a, b in zip(ours, theirs) if a != b] == [3 * (stop // 3 + 1)]
