"""Helpers for the Deadline tests: gates that send a real signal at a chosen moment, a simulated clock,
and what must be equal between a stopped-then-resumed run and an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Optional

import torch

from hf_callbacks_plus.core.callback import TrainerCallback

#: The schedule of every Deadline test's training (the tests import it): a log every 3 steps, an
#: evaluation every 4, a save every 8, 16 steps.
ARGS = {
    "max_steps": 16,
    "logging_steps": 3,
    "eval_strategy": "steps",
    "eval_steps": 4,
    "save_strategy": "steps",
    "save_steps": 8,
}
#: What a 2-rank (gloo) run adds to it.
DISTRIBUTED = {"ddp_backend": "gloo", "per_device_train_batch_size": 4}
#: Where a signal can land: inside a step, during an evaluation, during a save.
MOMENTS = ("step", "evaluation", "save")
#: Keys that measure the run (time), not the model: never equal between two runs.
TIMING = ("runtime", "per_second", "deadline/", "train_summary/")
#: What a complete checkpoint of a stock Trainer holds (model, optimizer, scheduler, RNG, state).
COMPLETE = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")


def stop_step(step: int, moment: str, steps_per_epoch: int) -> int:
    """The step a run stops after when the signal lands at ``moment`` of ``step`` (checks every step):
    inside step N it is N; during the evaluation or the save after step N, the next boundary: the
    epoch's end when N ends an epoch, else the next step's end."""
    return step if moment == "step" or step % steps_per_epoch == 0 else step + 1


class SignalAt(TrainerCallback):
    """Fault injection: a real signal (``os.kill``) to ``pid`` (default: this process) at ``moment``:
    ``"step"``: at the beginning of step ``step`` (inside it, before its forward pass);
    ``"evaluation"``: at the first batch of the evaluation after step ``step``;
    ``"save"``: inside the save of ``checkpoint-<step>``, its model and optimizer written, before its
    ``trainer_state.json`` (``TrainerState.save_to_json`` is wrapped while training)."""

    def __init__(
        self, step: int, moment: str = "step", sig: int = signal.SIGUSR1, pid: Optional[int] = None
    ) -> None:
        if moment not in MOMENTS:
            raise ValueError(f"moment must be one of {MOMENTS}, got {moment!r}")
        self.step, self.moment, self.sig, self.pid = step, moment, sig, pid
        self.sent = False
        self._patched: list[tuple[Any, Any]] = []

    def send(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(self.pid or os.getpid(), self.sig)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.moment != "save":
            return
        import transformers

        from hf_callbacks_plus.core import state as ours

        gate = self
        for cls in {transformers.TrainerState, ours.TrainerState}:
            original = cls.save_to_json

            def save_to_json(state_self, json_path, _original=original):
                if Path(json_path).parent.name == f"checkpoint-{gate.step}":
                    gate.send()
                return _original(state_self, json_path)

            cls.save_to_json = save_to_json
            self._patched.append((cls, original))

    def on_train_end(self, args, state, control, **kwargs):
        unpatch(self._patched)

    def on_exception(self, args, state, control, **kwargs):
        unpatch(self._patched)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.moment == "step" and state.global_step + 1 == self.step:
            self.send()

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.moment == "evaluation" and state.global_step == self.step:
            self.send()


class SimulatedClock:
    """Fault injection: the clock `Deadline` reads (its ``_clock``), advanced by the test's own
    callbacks instead of real time, so a slow save and a deadline are deterministic."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SimulatedCosts(TrainerCallback):
    """Advances a `SimulatedClock`: ``step`` seconds per step (at its beginning), ``evaluation`` per
    evaluation (at its first batch), ``save`` per save (inside it: the injected slow save). Put it
    before `Deadline` so that Deadline measures these costs."""

    def __init__(self, clock: SimulatedClock, step: float, evaluation: float, save: float) -> None:
        self.clock, self.costs = clock, {"step": step, "evaluation": evaluation, "save": save}
        self._evaluating = False
        self._patched: list[tuple[Any, Any]] = []
        #: (step, clock) at the end of every save, and at every step's end (a boundary).
        self.saves: list[tuple[int, float]] = []
        self.boundaries: list[tuple[int, float]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.advance(self.costs["step"])

    def on_step_end(self, args, state, control, **kwargs):
        self.boundaries.append((state.global_step, self.clock.now))

    def on_prediction_step(self, args, state, control, **kwargs):
        if not self._evaluating:
            self._evaluating = True
            self.clock.advance(self.costs["evaluation"])

    def on_evaluate(self, args, state, control, **kwargs):
        self._evaluating = False

    def on_train_begin(self, args, state, control, **kwargs):
        import transformers

        from hf_callbacks_plus.core import state as ours

        costs = self
        for cls in {transformers.TrainerState, ours.TrainerState}:
            original = cls.save_to_json

            def save_to_json(state_self, json_path, _original=original):
                if Path(json_path).parent.name.startswith("checkpoint-"):
                    costs.clock.advance(costs.costs["save"])
                return _original(state_self, json_path)

            cls.save_to_json = save_to_json
            self._patched.append((cls, original))

    def on_save(self, args, state, control, **kwargs):
        self.saves.append((state.global_step, self.clock.now))

    def on_train_end(self, args, state, control, **kwargs):
        unpatch(self._patched)

    def on_exception(self, args, state, control, **kwargs):
        unpatch(self._patched)


def unpatch(patched: list[tuple[Any, Any]]) -> None:
    """Put back what a gate wrapped."""
    while patched:
        cls, original = patched.pop()
        cls.save_to_json = original


def comparable(log_history: list[dict]) -> list[dict]:
    """``log_history`` without the end-of-training record and the timing values."""
    return [
        {key: value for key, value in record.items() if not any(part in key for part in TIMING)}
        for record in log_history
        if "train_runtime" not in record
    ]


def jsonl_points(path: Path) -> dict[tuple[str, int], float]:
    """Every curve point of a JsonlLogger file, by (key, step); a point written twice fails."""
    points: dict[tuple[str, int], float] = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        if record.get("event") != "log":
            continue
        for key, value in record["curves"].items():
            if any(part in key for part in TIMING):
                continue
            assert (key, record["step"]) not in points, f"{key} at step {record['step']} written twice"
            points[(key, record["step"])] = value
    return points


def same_weights(model_a: Any, model_b: Any) -> bool:
    """Bit-identical parameters."""
    a, b = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    return a.keys() == b.keys() and all(torch.equal(a[name].detach(), b[name].detach()) for name in a)


def complete(checkpoint: Path, files: tuple[str, ...] = COMPLETE) -> bool:
    """The checkpoint holds every file a resume needs."""
    return all((Path(checkpoint) / name).is_file() for name in files)
