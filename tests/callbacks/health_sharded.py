"""Scenarios of tests/callbacks/test_health_sharded.py: `SpikeGuard` and `TrainingHealth` under each
engine (tests/sharded.py) on the 2 ranks of the suite's launch.

A poisoned batch: at step ``POISON`` every rank's loss is multiplied by 1000 (the trainer's
``compute_loss`` wrapped on the instance, test-only), so the loss and the gradients spike there.
The reference for ``skip`` is the same run whose optimizer bypasses its step at that batch
(`BypassAdamW`, given through ``optimizer_cls_and_kwargs``; the schedule is constant so that the
reference's own scheduler step changes nothing)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from hf_callbacks_plus.callbacks.health import SpikeGuard, TrainingHealth
from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.runtime.engines import copy_optimizer_state
from tests import sharded

POISON, STEPS, SAVE = 6, 8, 4
GUARD = {"window": 8, "warmup": 3, "threshold": 50.0, "rollback_every": 2}


class BypassAdamW(torch.optim.AdamW):
    """AdamW whose step does nothing during optimizer step ``POISON`` (test-only reference)."""

    trainer: Any = None

    def step(self, closure: Any = None) -> Any:
        if BypassAdamW.trainer is not None and BypassAdamW.trainer.state.global_step + 1 == POISON:
            return None
        return super().step(closure)


def poison(trainer: Any) -> Any:
    original = trainer.compute_loss

    def compute_loss(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(model, inputs, *args, **kwargs)
        if trainer.state.global_step + 1 != POISON:
            return result
        if isinstance(result, tuple):
            return (result[0] * 1000, *result[1:])
        return result * 1000

    trainer.compute_loss = compute_loss
    return trainer


class Record(TrainerCallback):
    """Gathers the whole weights (a collective) and keeps this rank's optimizer state at given step ends."""

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.steps, self.trainer = steps, None
        self.weights: dict[int, dict[str, Any]] = {}
        self.moments: dict[int, Any] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if state.global_step in self.steps:
            self.weights[state.global_step] = sharded.full_weights(self.trainer)
            self.moments[state.global_step] = copy_optimizer_state(optimizer)


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def same_moments(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        set(x) == set(y) and all(torch.equal(x[k], y[k]) if hasattr(x[k],
                                                                    "shape") else x[k] == y[k] for k in x)
        for x, y in zip(a, b))


def train(engine: str, folder: Path, trainer_kind: str, callbacks: list, bypass: bool = False,
          resume: Any = None, **kwargs: Any) -> Any:
    options = {"max_steps": STEPS, "lr_scheduler_type": "constant", **kwargs}
    if engine.startswith("zero"):
        options["deepspeed"] = {"zero_allow_untested_optimizer": True}
    trainer = sharded.make_trainer(engine, folder, trainer=trainer_kind, callbacks=callbacks, **options)
    BypassAdamW.trainer = trainer if bypass else None
    trainer.optimizer_cls_and_kwargs = (BypassAdamW if bypass else torch.optim.AdamW,
                                        {"lr": trainer.args.learning_rate,
                                                          "weight_decay": trainer.args.weight_decay,
                                                          "betas": (trainer.args.adam_beta1,
                                                                    trainer.args.adam_beta2),
                                                          "eps": trainer.args.adam_epsilon})
    for callback in callbacks:
        if isinstance(callback, Record):
            callback.trainer = trainer
    if not hasattr(trainer, "key_grammar"):  # a stock or trl trainer: the guard needs its trainer
        from hf_callbacks_plus import run_before_integrations

        run_before_integrations(trainer)
    poison(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def guard_under_engine(out: Path, engine: str, trainer_kind: str = "trainer") -> None:
    """skip vs the bypassed reference; a resume of the skip run; rollback; stop."""
    outcome: dict[str, Any] = {}
    with sharded.sharded_on_cpu():
        reference = Record((STEPS,))
        train(engine, out / "reference", trainer_kind, [reference], bypass=True)
        guard, record = SpikeGuard("skip", **GUARD), Record((STEPS,))
        skipped = train(engine, out / "skip", trainer_kind, [guard, record], save_strategy="steps",
                        save_steps=SAVE)
        outcome["skip"] = {"spikes": guard.spike_steps, "skipped": guard.skipped_steps,
                           "same_weights": same(record.weights[STEPS], reference.weights[STEPS]),
                           "same_moments": same_moments(record.moments[STEPS], reference.moments[STEPS]),
                           "records": sharded.records(skipped)}
        resumed_guard, resumed = SpikeGuard("skip", **GUARD), Record((STEPS,))
        train(engine, out / "resumed", trainer_kind, [resumed_guard, resumed],
              resume=str(out / "skip" / f"checkpoint-{SAVE}"))
        outcome["resume"] = {"spikes": resumed_guard.spike_steps, "skipped": resumed_guard.skipped_steps,
                             "same_weights": same(resumed.weights[STEPS], record.weights[STEPS])}
        guard, record = SpikeGuard("rollback", **GUARD), Record((4, POISON))
        train(engine, out / "rollback", trainer_kind, [guard, record])
        outcome["rollback"] = {"spikes": guard.spike_steps, "rollbacks": guard.rollbacks,
                               "same_weights": same(record.weights[POISON], record.weights[4]),
                               "same_moments": same_moments(record.moments[POISON], record.moments[4])}
        guard, record = SpikeGuard("stop", **GUARD), Record((POISON,))
        stopped = train(engine, out / "stop", trainer_kind, [guard, record])
        checkpoint = out / "stop" / f"checkpoint-{POISON}"
        files = sharded.checkpoint_files(checkpoint) if checkpoint.is_dir() else {}
        outcome["stop"] = {"spikes": guard.spike_steps, "global_step": stopped.state.global_step,
                           "files": sorted(files)}
        if int(__import__("os").environ.get("RANK", "0")) == 0 and checkpoint.is_dir():
            saved = sharded.saved_weights(checkpoint)
            outcome["stop"]["saved_equal"] = all(torch.equal(saved[k],
                                                             record.weights[POISON][k]) for k in saved)
    sharded.write_json(out, outcome)
    for name in ("reference", "skip", "resumed", "rollback"):
        shutil.rmtree(out / name, ignore_errors=True)


class Norms(TrainerCallback):
    """The reference: per-parameter norms of the whole weights before and after each step (gathered)."""

    def __init__(self) -> None:
        self.trainer, self.before, self.found = None, None, {}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.before = sharded.full_weights(self.trainer)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        after = sharded.full_weights(self.trainer)
        from hf_callbacks_plus.runtime.engines import clean_parameter_name

        parameters = self.trainer.model.named_parameters()
        trained = {clean_parameter_name(n) for n, p in parameters if p.requires_grad}
        self.found[state.global_step] = {
            name: [float(after[name].norm()), float((after[name] - self.before[name]).norm())]
            for name in after if name in trained}


def norms_under_engine(out: Path, engine: str, trainer_kind: str = "trainer") -> None:
    """TrainingHealth's per-parameter norms (one group per parameter) against the gathered weights."""
    with sharded.sharded_on_cpu():
        reference = Norms()
        trainer = sharded.make_trainer(engine, out / "run", trainer=trainer_kind, max_steps=2,
                                       max_grad_norm=0.0,
                                       callbacks=[reference], lr_scheduler_type="constant")
        names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        from hf_callbacks_plus.runtime.engines import clean_parameter_name

        groups = {clean_parameter_name(n).replace(".", "_"): [clean_parameter_name(n)] for n in names}
        health = TrainingHealth(groups=groups)
        trainer.add_callback(health)
        reference.trainer = trainer
        if not hasattr(trainer, "key_grammar"):
            from hf_callbacks_plus import run_before_integrations

            run_before_integrations(trainer)
        trainer.train()
    records = [r for r in trainer.state.log_history if "loss" in r]
    sharded.write_json(out, {"records": records, "reference": reference.found,
                             "groups": {g: clean_parameter_name(n) for g, n in zip(groups, names)}})
    shutil.rmtree(out / "run", ignore_errors=True)
