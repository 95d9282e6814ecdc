"""The callbacks that watch a metric (issue 40 item 5; issue 41 items 2 and 3), tested as a class:
each watcher (`EarlyStopping`, `KeepBestCheckpoints`, `TerminateOnNonFinite`) in each runner (a stock
``transformers.Trainer`` never bound, ``TrainerPlus``, ``LightweightTrainer``).

* A mistake knowable before training is refused before the first step: a ``train_subset_``/``gap_``
  metric without the `TrainSubsetEvaluation` that reports it (it trained the whole run with the
  watcher inactive and said so at the end).
* A name only the first evaluation can check (a ``compute_metrics`` key, misspelt) is refused
  without losing the work: the trainer saves that step first, training stops, the error names the
  checkpoint, and resuming from it after fixing the name trains on (it raised at the first
  evaluation and lost every step before it).
* ``load_best_model_at_end`` and ``EarlyStopping(restore_best=True)`` on other metrics: one warning
  at train begin says which weights the model keeps, and it does keep them.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

from hf_callbacks_plus import TrainSubsetEvaluation
from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
from hf_callbacks_plus.callbacks.console_summary import ConsoleSummary
from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from hf_callbacks_plus.callbacks.terminate_on_nonfinite import TerminateOnNonFinite
from hf_callbacks_plus.integrations.transformers import TrainerPlus
from tests.callbacks.early_stopping_helpers import checkpoint_steps, scripted_lightweight, scripted_trainer

pytestmark = pytest.mark.transformers

WATCHERS = {
    "EarlyStopping": lambda name: EarlyStopping(name, mode="min", verbose=False),
    "KeepBestCheckpoints": lambda name: KeepBestCheckpoints(name, mode="min", verbose=False),
    "TerminateOnNonFinite": lambda name: TerminateOnNonFinite(monitor=name, verbose=False),
}
#: ``eval_score`` improves at every evaluation: no watcher stops a run on its own.
IMPROVING = {step: 10.0 - step for step in range(0, 40)}


def run(runner: str, output_dir: Path, callbacks: list, **args):
    """A 6-step run evaluating every 2 steps, in the runner named."""
    args = {"max_steps": 6, "eval_steps": 2, "logging_steps": 2, **args}
    if runner == "lightweight":
        return scripted_lightweight(output_dir, IMPROVING, callbacks=callbacks, **args)
    return scripted_trainer(output_dir, IMPROVING, callbacks=callbacks,
                            trainer_class=TrainerPlus if runner == "TrainerPlus" else None, **args)


def saves(watcher: str) -> dict:
    """KeepBestCheckpoints needs saves that meet the evaluations; the others save nothing of their own
    (a checkpoint at the refused step is the refusal's own save)."""
    return {"save_strategy": "steps", "save_steps": 4} if watcher == "KeepBestCheckpoints" else {}


def matrix(first_tier: set) -> list:
    """Every watcher in every runner; the pairs outside ``first_tier`` in the second tier."""
    pairs = [(watcher, runner) for watcher in WATCHERS for runner in ("stock", "TrainerPlus", "lightweight")]
    return [pytest.param(*pair, marks=() if pair in first_tier else pytest.mark.second_tier)
            for pair in pairs]


# -- knowable before the first step -----------------------------------------------------------------
@pytest.mark.parametrize(("watcher", "runner"), matrix({("EarlyStopping", "stock"), (
    "KeepBestCheckpoints", "TrainerPlus"), ("TerminateOnNonFinite", "lightweight")}))
@pytest.mark.parametrize("monitor", ["train_subset_score", "gap_score"])
def test_a_metric_no_callback_produces_is_refused_before_the_first_step(tmp_path, watcher, runner, monitor):
    trainer = run(runner, tmp_path, [WATCHERS[watcher](monitor)], **saves(watcher))
    producer = re.escape("TrainSubsetEvaluation(gap_metrics=True)" if monitor.startswith("gap")
                         else "TrainSubsetEvaluation")
    with pytest.raises(ValueError, match=rf"'{monitor}' is a .* metric, which only {producer}.*Add"):
        trainer.train()
    assert trainer.state.global_step == 0 and checkpoint_steps(tmp_path) == []


@pytest.mark.parametrize("runner", ["stock", "TrainerPlus"])
def test_with_its_producer_the_metric_is_watched(tmp_path, runner):
    """The producer announced at train begin: no refusal, and the watcher sees the metric (a stock
    Trainer wired with run_before_integrations; TrainSubsetEvaluation listed after the watcher)."""
    from hf_callbacks_plus.integrations.ordering import run_before_integrations

    stopper = EarlyStopping("gap_loss", mode="min", verbose=False, patience=10)
    subset = TrainSubsetEvaluation(size=16, gap_metrics=["loss"])
    trainer = run(runner, tmp_path, [stopper, subset] if runner == "TrainerPlus" else [])
    if runner == "stock":
        run_before_integrations(trainer, stopper, subset)
    trainer.train()
    assert trainer.state.global_step == 6 and stopper.best_step is not None


def test_strict_false_warns_before_the_first_step_and_at_the_end_and_the_model_can_be_saved(tmp_path, caplog):
    stopper = EarlyStopping("train_subset_score", mode="min", strict=False)
    trainer = run("stock", tmp_path, [stopper])
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    assert trainer.state.global_step == 6 and (tmp_path / "final" / "model.safetensors").exists()
    assert "only TrainSubsetEvaluation(...) reports" in caplog.text
    assert "(strict=False: continuing.)" in caplog.text
    assert "no evaluation of this run returned the monitored metric" in caplog.text


# -- knowable at the first evaluation only: save first, then refuse -----------------------------------
@pytest.mark.parametrize(("watcher", "runner"), matrix({
    ("EarlyStopping", "stock"), ("EarlyStopping", "TrainerPlus"), ("EarlyStopping", "lightweight"),
    ("KeepBestCheckpoints", "stock"), ("TerminateOnNonFinite", "lightweight")}))
def test_a_misspelt_metric_is_refused_after_a_save_and_the_run_resumes_from_it(tmp_path, watcher, runner):
    first = run(runner, tmp_path, [WATCHERS[watcher]("eval_scor")], **saves(watcher))
    with pytest.raises(RuntimeError, match=r"Did you mean 'eval_score'") as refused:
        first.train()
    checkpoint = tmp_path / "checkpoint-2"
    assert first.state.global_step == 2 and checkpoint_steps(tmp_path) == [2]  # saved at the refused step
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 2
    assert f"after saving {checkpoint}" in str(refused.value)
    assert f"trainer.train(resume_from_checkpoint='{checkpoint}')" in str(refused.value)

    fixed = WATCHERS[watcher]("eval_score")
    second = run(runner, tmp_path, [fixed], **saves(watcher))
    second.train(resume_from_checkpoint=str(checkpoint))
    assert second.state.global_step == 6
    steps = [record["step"] for record in second.state.log_history if "eval_score" in record]
    assert steps == [2, 4, 6]  # step 2 from the checkpoint, then trained on from it
    if watcher == "EarlyStopping":
        assert (fixed.best_step, fixed.best_value) == (6, 4.0)
    if watcher == "KeepBestCheckpoints":
        assert [entry.step for entry in fixed.ranking["eval_score"]] == [6]  # ranked by the resumed run


def test_a_non_numeric_metric_is_refused_after_a_save_with_its_own_error(tmp_path):
    stopper = EarlyStopping("eval_label", mode="min")
    trainer = run("stock", tmp_path, [stopper])
    trainer.compute_metrics = lambda prediction: {"label": "cat"}
    with pytest.raises(TypeError, match=r"'eval_label' is not a number: 'cat' \(str\).* after saving"):
        trainer.train()
    assert checkpoint_steps(tmp_path) == [2]


def test_the_refusal_asks_for_a_save_and_a_stop_and_raises_at_train_end(tmp_path):
    """The protocol on its own: the miss sets should_save and should_training_stop; the error comes
    at train end, naming the checkpoint the save made, or saying none was made (a trainer that
    skipped the save: save_strategy='best' lets the evaluation decide)."""
    from types import SimpleNamespace

    from hf_callbacks_plus.core.state import TrainerControl, TrainerState

    for saved in (True, False):
        stopper, state, control = EarlyStopping("eval_score", mode="min"), TrainerState(global_step=2), \
            TrainerControl()
        args = SimpleNamespace(output_dir=str(tmp_path), eval_strategy="steps", save_strategy="best")
        stopper.on_train_begin(args, state, control)
        stopper.on_evaluate(args, state, control, metrics={"eval_scor": 1.0, "eval_runtime": 0.1})
        assert control.should_save and control.should_training_stop
        if saved:
            stopper.on_save(args, state, control)
        expected = ("after saving .*checkpoint-2" if saved
                    else r"unsaved \(save_strategy='best' saved no checkpoint")
        with pytest.raises(RuntimeError, match=expected):
            stopper.on_train_end(args, state, control)


# -- which weights end up in the model ---------------------------------------------------------------
def _weights(model) -> dict:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def test_load_best_model_at_end_and_restore_best_on_other_metrics_say_which_weights_win(tmp_path, caplog):
    """The trainer's best is the highest score (step 6); EarlyStopping's the lowest (step 2): one
    warning at train begin names both, and the model ends with EarlyStopping's, which is loaded last."""
    from safetensors.torch import load_file

    stopper = EarlyStopping("eval_score", mode="min", restore_best=True, patience=10, verbose=False)
    trainer = scripted_trainer(tmp_path, {2: 1.0, 4: 2.0, 6: 3.0}, callbacks=[stopper], max_steps=6,
                               save_strategy="steps", save_steps=2, load_best_model_at_end=True,
                               metric_for_best_model="score", greater_is_better=True)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    said = [record.getMessage() for record in caplog.records
            if "mechanisms load their best weights" in record.getMessage()]
    assert len(said) == 1
    assert ("load_best_model_at_end (metric_for_best_model='score', greater_is_better=True); then "
            "restore_best of EarlyStopping('eval_score', mode='min')") in said[0]
    assert said[0].endswith("The model ends with the weights of the last: restore_best of EarlyStopping("
                            "'eval_score', mode='min'). Keep one of them (or let them watch the same metric "
                            "and mode).")
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-6") and stopper.best_step == 2
    saved = load_file(str(tmp_path / "checkpoint-2" / "model.safetensors"))
    final = _weights(trainer.model)
    assert all(torch.equal(final[name], saved[name]) for name in saved)


@pytest.mark.parametrize(("stoppers", "args", "warned"), [
    (lambda: [EarlyStopping("eval_score", mode="max", restore_best=True)],
     {"load_best_model_at_end": True, "metric_for_best_model": "score", "greater_is_better": True}, False),
    (lambda: [EarlyStopping("eval_score", mode="min", restore_best=True)], {}, False),
    (lambda: [EarlyStopping("eval_score", mode="min", restore_best=True),
              EarlyStopping("eval_loss", restore_best=True)], {}, True),
], ids=["same metric and mode", "restore_best alone", "two instances on two metrics"])
def test_who_restores_is_said_once_and_only_when_they_disagree(tmp_path, caplog, stoppers, args, warned):
    save = {"save_strategy": "steps", "save_steps": 2} if args else {}
    trainer = scripted_trainer(tmp_path, IMPROVING, callbacks=stoppers(), max_steps=2,
                               trainer_class=TrainerPlus, **save, **args)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert caplog.text.count("mechanisms load their best weights") == (1 if warned else 0)


# -- the console's names ------------------------------------------------------------------------------
def test_console_summary_warns_about_a_name_it_cannot_show_and_prints_on(tmp_path, caplog, capsys):
    summary = ConsoleSummary("eval_scor")
    trainer = run("TrainerPlus", tmp_path, [summary], max_steps=4)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert caplog.text.count("Metric 'eval_scor' was not found") == 1
    assert "Did you mean 'eval_score'" in caplog.text
    assert capsys.readouterr().out.count("| eval_loss") == 2  # one line per evaluation, as before
    never = run("TrainerPlus", tmp_path / "b", [ConsoleSummary("eval_score")], eval_strategy="no",
                max_steps=2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        never.train()
    assert "args.eval_strategy='no'" in caplog.text and never.state.global_step == 2
