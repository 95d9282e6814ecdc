"""Run one configuration through a real transformers.Trainer and through LightweightTrainer.

Both runs use the same TrainingArguments (converted with ``LoopArguments.from_training_arguments``),
the same number of train/eval batches and the same *scripted* evaluation metric, so
best-metric decisions (``save_strategy="best"``, ``load_best_model_at_end``) are identical
by construction. Each run records its events with an ``EventRecorder``.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments
from hf_callbacks_plus.testing import EventRecorder, diff_traces
from tests.tiny_models import make_trainer, training_args

#: Values of the scripted ``mse`` metric, one per evaluation: improvements and setbacks.
SCRIPT = (0.9, 0.7, 0.8, 0.5, 0.5, 0.6, 0.3, 0.4, 0.2, 0.25, 0.1, 0.15)


class ScriptedMetrics:
    """``compute_metrics``/``metrics_fn`` returning the next value of :data:`SCRIPT` at each call."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, _outputs: Any) -> dict[str, float]:
        value = SCRIPT[self.calls % len(SCRIPT)]
        self.calls += 1
        return {"mse": value, "mae": value / 2}


def run_transformers(
    output_dir: Path,
    callbacks: Sequence[Any] = (),
    n_train: int = 64,
    n_eval: int = 16,
    resume: Any = None,
    setup: Any = None,
    **overrides: Any,
) -> tuple[EventRecorder, Any]:
    """Train a real transformers.Trainer with an EventRecorder last among the user callbacks."""
    recorder = EventRecorder()
    trainer = make_trainer(
        output_dir,
        callbacks=[*callbacks, recorder],
        n_train=n_train,
        n_eval=n_eval,
        compute_metrics=ScriptedMetrics(),
        **overrides,
    )
    if setup is not None:
        setup(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return recorder, trainer


def run_lightweight(
    output_dir: Path,
    callbacks: Sequence[Any] = (),
    n_train: int = 64,
    n_eval: int = 16,
    resume: Any = None,
    setup: Any = None,
    **overrides: Any,
) -> tuple[EventRecorder, LightweightTrainer]:
    """Train LightweightTrainer on the same shape of data with the same arguments."""
    args = LoopArguments.from_training_arguments(training_args(output_dir, **overrides))
    batch = args.per_device_train_batch_size
    train_data = [[1.0] * min(batch, n_train - start) for start in range(0, n_train, batch)]
    eval_batch = args.per_device_eval_batch_size
    eval_data = [[1.0] * min(eval_batch, n_eval - start) for start in range(0, n_eval, eval_batch)]
    recorder = EventRecorder()
    trainer = LightweightTrainer(
        args,
        train_step=lambda batch_: {"loss": 1.0, "grad_norm": 0.5},
        train_data=train_data,
        eval_data=eval_data,
        eval_step=lambda batch_: 0.25,
        metrics_fn=ScriptedMetrics(),
        learning_rate_fn=lambda: 0.1,
        callbacks=[*callbacks, recorder],
    )
    if setup is not None:
        setup(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return recorder, trainer


def checkpoints(output_dir: Path) -> list[str]:
    """Names of the ``checkpoint-N`` folders left in ``output_dir``, sorted by N."""
    if not output_dir.is_dir():
        return []
    names = [name for name in os.listdir(output_dir) if name.startswith("checkpoint-")]
    return sorted(names, key=lambda name: int(name.split("-")[1]))


def date_checkpoints(output_dir: Path, seconds_apart: float = 2.0) -> None:
    """Date the checkpoint folders like a real run writes them: seconds apart, in step order.

    A fast test run writes every checkpoint within one second, and transformers then orders them
    by step; dated with ``os.utime`` (ten minutes ago, ``seconds_apart`` apart), rotation by
    ``save_total_limit`` orders them by modification time, as it does after a real run.
    """
    start = time.time() - 600
    for position, name in enumerate(checkpoints(output_dir)):
        stamp = start + position * seconds_apart
        os.utime(output_dir / name, (stamp, stamp))


def assert_same_run(
    tmp_path: Path, callbacks_factory: Any = None, setup: Any = None, **config: Any
) -> EventRecorder:
    """Run ``config`` in both trainers; assert identical traces, log keys and checkpoints left.

    ``setup(trainer)``, when given, is called on each trainer before ``train()``.

    Returns:
        The transformers trace (for extra assertions on what the configuration exercises).
    """
    make_callbacks = callbacks_factory or (lambda: [])
    hf_dir, lw_dir = tmp_path / "hf", tmp_path / "lw"
    expected, hf_trainer = run_transformers(hf_dir, callbacks=make_callbacks(), setup=setup, **config)
    actual, lw_trainer = run_lightweight(lw_dir, callbacks=make_callbacks(), setup=setup, **config)
    report = diff_traces(expected, actual, names=("transformers.Trainer", "LightweightTrainer"))
    assert report is None, report
    assert checkpoints(hf_dir) == checkpoints(lw_dir)
    assert_same_state(hf_trainer.state, lw_trainer.state, hf_dir, lw_dir)
    return expected


def assert_same_state(hf_state: Any, lw_state: Any, hf_dir: Path, lw_dir: Path) -> None:
    """Same counters, best-metric tracking and log_history keys (values of timings excluded)."""
    for name in ("global_step", "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps"):
        assert getattr(hf_state, name) == getattr(lw_state, name), name
    assert math.isclose(hf_state.epoch, lw_state.epoch)
    assert hf_state.best_metric == lw_state.best_metric
    assert hf_state.best_global_step == lw_state.best_global_step
    hf_best, lw_best = hf_state.best_model_checkpoint, lw_state.best_model_checkpoint
    assert (hf_best is None) == (lw_best is None)
    if hf_best is not None:
        assert os.path.relpath(hf_best, hf_dir) == os.path.relpath(lw_best, lw_dir)
    hf_history, lw_history = hf_state.log_history, lw_state.log_history
    assert [sorted(entry) for entry in hf_history] == [sorted(entry) for entry in lw_history]
    assert [entry["step"] for entry in hf_history] == [entry["step"] for entry in lw_history]
