"""EarlyStopping(restore_best=True) ends on the weights of its own best step, in every
combination of ``metric_for_best_model``, ``load_best_model_at_end``, ``save_total_limit``,
``min_delta`` and resume (a real ``transformers.Trainer`` on the tiny regression model).

Ground truth, independent of the callback: the best step is computed here from the scripted
values with the documented rule (an improvement must beat the best by more than
``min_delta``), and the expected weights are the ones a recorder copied at that step's
evaluation. The script makes transformers' own best move on improvements smaller than
``min_delta`` (steps 4 and 6), so with a save limit transformers protects a different
checkpoint than ours and rotates ours away.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Optional

import pytest

pytest.importorskip("transformers")

from transformers import TrainerCallback  # noqa: E402

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from tests.callbacks.early_stopping_helpers import scripted_trainer  # noqa: E402
from tests.callbacks.sharded_callbacks import StopAt  # noqa: E402

pytestmark = pytest.mark.transformers

#: eval_score by step (lower is better): 4 and 6 improve by less than 0.1.
SCRIPT = {2: 5.0, 4: 4.95, 6: 4.9, 8: 5.5, 10: 5.6, 12: 5.7, 14: 5.8, 16: 5.9}
PATIENCE = 3


def expected_best_step(min_delta: float, last_step: Optional[int] = None) -> int:
    best_step, best = None, None
    for step, value in sorted(SCRIPT.items()):
        if last_step is not None and step > last_step:
            break
        if best is None or value < best - min_delta:
            best_step, best = step, value
    return best_step


class RecordWeights(TrainerCallback):
    """Copies the model's weights at every evaluation (the weights the checkpoint of that step holds)."""

    def __init__(self) -> None:
        self.weights: dict[int, tuple[float, float]] = {}

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = (model.a.item(), model.b.item())



def run(tmp_path: Path, *, metric: Optional[str], load_best: bool, limit: Optional[int], min_delta: float,
        stop_at: Optional[int] = None, resume: Optional[str] = None) -> tuple[Any, Any, Any]:
    stopper = EarlyStopping("eval_score", mode="min", patience=PATIENCE, min_delta=min_delta,
                            restore_best=True)
    recorder = RecordWeights()
    callbacks: list[Any] = [stopper, recorder] + ([StopAt(stop_at)] if stop_at else [])
    extra: dict[str, Any] = {}
    if metric is not None:
        extra.update(metric_for_best_model=metric, greater_is_better=False)
    trainer = scripted_trainer(tmp_path, SCRIPT, callbacks=callbacks, max_steps=16, save_strategy="steps",
                               save_steps=2, save_total_limit=limit, load_best_model_at_end=load_best,
                               learning_rate=0.05, **extra)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, stopper, recorder


def final_weights(trainer: Any) -> tuple[float, float]:
    return trainer.model.a.item(), trainer.model.b.item()


CONFIGS = [
    (metric, load_best, limit, min_delta)
    for metric, load_best, limit, min_delta in itertools.product(
        [None, "eval_score", "eval_loss"], [False, True], [None, 1, 2], [0.0, 0.1])
    if not (load_best and metric is None)  # transformers needs a metric to load its best
]


@pytest.mark.parametrize(("metric", "load_best", "limit", "min_delta"), CONFIGS,
                         ids=[f"mfbm={m}-lbmae={lb}-limit={lim}-delta={d}" for m, lb, lim, d in CONFIGS])
def test_ends_on_its_own_best_weights(tmp_path, metric, load_best, limit, min_delta):
    trainer, stopper, recorder = run(tmp_path, metric=metric, load_best=load_best, limit=limit,
                                     min_delta=min_delta)
    best = expected_best_step(min_delta)
    assert stopper.best_step == best
    assert stopper.stopped_step == best + 2 * PATIENCE
    assert recorder.weights[stopper.stopped_step] != recorder.weights[best]  # training moved on
    assert final_weights(trainer) == pytest.approx(recorder.weights[best], abs=0.0)


RESUMES = [
    # (stop the first run at, min_delta, limit, metric): resumed after the best, at it, before it
    (4, 0.1, 1, "eval_score"),  # ours at 2, transformers' at 4: checkpoint-2 rotated before the resume
    (4, 0.1, None, None),
    (4, 0.1, 2, "eval_loss"),
    (2, 0.1, 1, "eval_score"),  # resumed from the best step's own checkpoint
    (4, 0.0, 1, "eval_score"),  # resumed before the best (6)
    (8, 0.0, 1, None),
]


@pytest.mark.parametrize(("stop_at", "min_delta", "limit", "metric"), RESUMES)
def test_ends_on_its_own_best_weights_after_a_resume(tmp_path, stop_at, min_delta, limit, metric):
    _, _, first = run(tmp_path, metric=metric, load_best=False, limit=limit, min_delta=min_delta,
                      stop_at=stop_at)
    checkpoint = tmp_path / f"checkpoint-{stop_at}"
    trainer, stopper, second = run(tmp_path, metric=metric, load_best=False, limit=limit, min_delta=min_delta,
                                   resume=str(checkpoint))
    weights = {**first.weights, **second.weights}
    best = expected_best_step(min_delta)
    assert stopper.best_step == best and stopper.stopped_step == best + 2 * PATIENCE
    assert final_weights(trainer) == pytest.approx(weights[best], abs=0.0)


def saved_best_checkpoint(checkpoint: Path) -> Optional[str]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    entries = state["stateful_callbacks"]["EarlyStopping"]
    entry = entries[-1] if isinstance(entries, list) else entries
    return entry["attributes"]["best_checkpoint"]


@pytest.mark.parametrize("limit", [None, 1, 2])
def test_saved_state_names_the_best_checkpoint_that_exists(tmp_path, limit):
    """The state written into each checkpoint names the best step's checkpoint as it stands
    (the trainer writes it before ``on_save``, so at the best step itself too)."""
    run(tmp_path, metric="eval_score", load_best=False, limit=limit, min_delta=0.0, stop_at=8)
    # min_delta=0: best at 6, also transformers' best, so rotation keeps checkpoint-6
    left = sorted(tmp_path.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert (tmp_path / "checkpoint-6").is_dir() and left
    for checkpoint in left:
        step = int(checkpoint.name.split("-")[1])
        assert saved_best_checkpoint(checkpoint) == (str(tmp_path / "checkpoint-6") if step >= 6 else
                                                     str(tmp_path / f"checkpoint-{step}"))


def test_saved_state_never_names_a_deleted_checkpoint(tmp_path):
    run(tmp_path, metric="eval_score", load_best=False, limit=1, min_delta=0.1, stop_at=8)
    # ours at 2, transformers' best moved to 6: checkpoint-2 rotated away
    assert not (tmp_path / "checkpoint-2").exists()
    for checkpoint in tmp_path.glob("checkpoint-*"):
        assert saved_best_checkpoint(checkpoint) is None, checkpoint
