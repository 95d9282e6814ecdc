"""KeepBestCheckpoints on a real transformers.Trainer (and TrainerPlus, LightweightTrainer): the k
best are kept whatever save_total_limit deletes, with the right weights, as hard links; the
trainer's own rotation is unchanged; load_best_model_at_end and EarlyStopping agree on the best."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerCallback

from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints, TopK
from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from tests.callbacks.best_checkpoints_helpers import (
    KEPT,
    WeightsAtSave,
    checkpoint_steps,
    expected_ranking,
    kept_steps,
    kept_weights,
    manifest,
    scripted_run,
)

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

#: eval_score by step: a NaN, a tie (steps 6 and 14), the best at step 10.
SCORE = {2: 5.0, 4: 3.0, 6: 2.0, 8: math.nan, 10: 1.0, 12: 4.0, 14: 2.0, 16: 6.0}
SAVED = sorted(SCORE)


@pytest.fixture(autouse=True)
def _trusted_checkpoints(monkeypatch):
    """transformers < 4.47 loads rng_state.pth with torch.load's old default, refused by torch >= 2.6
    (weights_only); the checkpoints are this test's own."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A stock Trainer keeping the 3 best by eval_score with save_total_limit=2 (and a JSONL logger
    after it), and the same run without our callbacks."""
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger

    root = tmp_path_factory.mktemp("keep")
    keeper, weights = KeepBestCheckpoints("eval_score", k=3, mode="min"), WeightsAtSave()
    trainer = scripted_run(root / "ours", [keeper, weights, JsonlLogger(root / "metrics.jsonl")], score=SCORE,
                           save_total_limit=2)
    trainer.train()
    scripted_run(root / "stock", score=SCORE, save_total_limit=2).train()
    return SimpleNamespace(root=root, dir=root / "ours", trainer=trainer, keeper=keeper,
                           weights=weights.weights)


def test_keeps_the_k_best_whatever_rotation_deletes(run):
    expected = expected_ranking({"score": SCORE}, [("score", 3, "min")], SAVED)
    assert expected == {"eval_score": [10, 6, 14]}  # NaN never ranks, the tie keeps step 6 first
    assert [e.step for e in run.keeper.ranking["eval_score"]] == expected["eval_score"]
    assert kept_steps(run.dir) == [6, 10, 14]
    # transformers' rotation is untouched: the same checkpoint-N folders as the stock run
    assert checkpoint_steps(run.dir) == checkpoint_steps(run.root / "stock") == [14, 16]
    for step in (6, 10, 14):  # the weights of that step, although checkpoint-6/-10 were rotated away
        assert kept_weights(run.dir / KEPT / f"checkpoint-{step}") == run.weights[step]
    data = manifest(run.dir)
    assert data["ranking"] == expected
    assert [(c["step"], c["path"], c["ranks"], c["values"]) for c in data["checkpoints"]] == [
        (6, "checkpoint-6", {"eval_score": 2}, {"eval_score": 2.0}),
        (10, "checkpoint-10", {"eval_score": 1}, {"eval_score": 1.0}),
        (14, "checkpoint-14", {"eval_score": 3}, {"eval_score": 2.0})]
    assert run.keeper.best_checkpoint == str((run.dir / KEPT / "checkpoint-10").resolve())


def test_kept_files_are_copies_without_the_resume_only_files(run):
    kept, original = run.dir / KEPT / "checkpoint-14", run.dir / "checkpoint-14"  # not rotated yet
    names = sorted(os.listdir(kept))
    assert names == ["model.safetensors", "trainer_state.json", "training_args.bin"]
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(os.listdir(original))
    for name in names:  # the same bytes in a file of their own
        assert not os.path.samefile(kept / name, original / name), name
        assert (kept / name).read_bytes() == (original / name).read_bytes(), name


def test_ranking_reaches_the_trackers_summary_and_the_plot(run):
    """A stock Trainer: our loggers after the callback get the ranking in the run summary; the plot
    reads it from the JSONL log or from the newest checkpoint's state."""
    from hf_callbacks_plus.plotting import collect_curves, load_log_history

    ranking = {"best_checkpoints/eval_score/rank1_step": 10, "best_checkpoints/eval_score/rank1_value": 1.0,
               "best_checkpoints/eval_score/rank2_step": 6, "best_checkpoints/eval_score/rank2_value": 2.0,
               "best_checkpoints/eval_score/rank3_step": 14, "best_checkpoints/eval_score/rank3_value": 2.0}
    lines = [json.loads(line) for line in (run.root / "metrics.jsonl").read_text().splitlines()]
    summaries = [line["summary"] for line in lines if line.get("summary")]
    assert {key: summaries[-1][key] for key in ranking} == ranking  # the run summary, not a curve
    assert not any(key.startswith("best_checkpoints") for line in lines for key in line.get("curves", {}))
    assert collect_curves(*load_log_history(run.root / "metrics.jsonl")).kept_steps == [6, 10, 14]
    assert collect_curves(*load_log_history(run.dir)).kept_steps == [6, 10, 14]  # checkpoint-16's state


def test_trainer_plus_puts_the_ranking_in_log_history(tmp_path):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from hf_callbacks_plus.plotting import collect_curves

    keeper = KeepBestCheckpoints("eval_score", k=2, mode="min", verbose=False)
    trainer = scripted_run(tmp_path, [keeper], score=SCORE, trainer_class=TrainerPlus, save_total_limit=1)
    trainer.train()
    final = trainer.state.log_history[-1]
    ranks = [final[f"best_checkpoints/eval_score/rank{rank}_step"] for rank in (1, 2)]
    assert ranks == [10, 6]
    assert kept_steps(tmp_path) == [6, 10]
    assert collect_curves(trainer.state.log_history).kept_steps == [6, 10]


class WritesAfterUs(TrainerCallback):
    """A callback listed after ours that adds a file to each checkpoint in its own on_save (as
    stateful callbacks do with trainer_state.json on transformers < 4.45)."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        (folder / "notes.json").write_text(json.dumps({"step": state.global_step}))


def test_what_later_callbacks_write_into_the_checkpoint_is_kept_too(tmp_path):
    keeper = KeepBestCheckpoints("eval_score", k=2, mode="min")
    scripted_run(tmp_path, [keeper, WritesAfterUs()], score=SCORE, save_total_limit=1).train()
    assert kept_steps(tmp_path) == [6, 10] and not (tmp_path / "checkpoint-10").exists()
    for step in (6, 10):
        notes = tmp_path / KEPT / f"checkpoint-{step}" / "notes.json"
        assert json.loads(notes.read_text()) == {"step": step}


def test_resumable_keeps_everything_and_resumes_from_a_kept_checkpoint(tmp_path):
    keeper = KeepBestCheckpoints("eval_score", k=1, mode="min", resumable=True)
    scripted_run(tmp_path, [keeper], score=SCORE, save_total_limit=1).train()
    kept = tmp_path / KEPT / "checkpoint-10"
    assert sorted(os.listdir(kept)) == sorted(os.listdir(tmp_path / "checkpoint-16"))
    again = scripted_run(tmp_path / "again", score=SCORE)
    again.train(resume_from_checkpoint=str(kept))  # optimizer, scheduler, RNG restored from it
    assert again.state.global_step == 16


def test_save_total_limit_1_with_load_best_model_at_end_and_early_stopping_agree(tmp_path):
    """transformers #25129's setting: the stock end-of-training cleanup keeps only its best; ours
    are all there, and the three agree on the best step."""
    keeper = KeepBestCheckpoints(k=3)  # monitor=None: metric_for_best_model, as transformers reads it
    stopper = EarlyStopping("eval_score", mode="min", patience=100, check_finite=False)
    trainer = scripted_run(tmp_path, [keeper, stopper], score=SCORE, save_total_limit=1,
                           load_best_model_at_end=True, metric_for_best_model="score",
                           greater_is_better=False)
    trainer.train()
    assert checkpoint_steps(tmp_path) == [10]
    assert kept_steps(tmp_path) == [6, 10, 14]
    best_step = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[1])  # best_global_step: >= 4.50
    assert best_step == stopper.best_step == keeper.ranking["eval_score"][0].step == 10


def test_several_metrics_each_with_its_own_k_and_mode(tmp_path):
    accuracy = {2: 0.5, 4: 0.6, 6: 0.55, 8: 0.9, 10: 0.7, 12: 0.9, 14: math.inf, 16: 0.8}
    keeper = KeepBestCheckpoints([TopK("eval_score", k=2, mode="min"), TopK("eval/acc", k=1, mode="max")])
    scripted_run(tmp_path, [keeper], score=SCORE, acc=accuracy, save_total_limit=2).train()
    specs = [("score", 2, "min"), ("acc", 1, "max")]
    expected = expected_ranking({"score": SCORE, "acc": accuracy}, specs, SAVED)
    assert expected == {"eval_score": [10, 6], "eval_acc": [14]}  # +Inf is the best accuracy
    assert {name: [e.step for e in kept] for name, kept in keeper.ranking.items()} == expected
    assert kept_steps(tmp_path) == [6, 10, 14]
    ranks = {c["step"]: c["ranks"] for c in manifest(tmp_path)["checkpoints"]}
    assert ranks == {6: {"eval_score": 2}, 10: {"eval_score": 1}, 14: {"eval_acc": 1}}


def test_plot_marks_the_kept_steps(run):
    pytest.importorskip("matplotlib")
    from hf_callbacks_plus.plotting import plot_learning_curves

    figure = plot_learning_curves(run.dir)
    (legend,) = figure.legends
    assert "kept checkpoints (3)" in [text.get_text() for text in legend.get_texts()]
    marks = [line for axis in figure.axes for line in axis.get_lines()
             if line.get_label() == "kept checkpoints (3)"]
    assert marks and all(list(line.get_xdata()) == [6, 10, 14] for line in marks)


def test_save_strategy_best_ranks_the_saves_it_makes(tmp_path):
    from hf_callbacks_plus._compat import transformers_version

    if transformers_version() < (4, 47):
        pytest.skip("save_strategy='best' came with transformers 4.47")
    keeper = KeepBestCheckpoints(k=2)  # the trainer saves at each new best of metric_for_best_model
    scripted_run(tmp_path, [keeper], score=SCORE, save_strategy="best", metric_for_best_model="score",
                 greater_is_better=False).train()
    assert [e.step for e in keeper.ranking["eval_score"]] == [10, 6] and kept_steps(tmp_path) == [6, 10]


@pytest.mark.parametrize(("monitor", "mode"), [("eval_b_mse", "min"), ("train_subset_mae", "min"),
                                               ("gap_mse", "max"), ("loss", "min")])
def test_any_monitored_metric_ranks_as_its_logged_values(tmp_path, monitor, mode):
    """Per-dataset, train-subset, gap and training-loss metrics (TrainerPlus: train-subset keys reach
    log_history): the kept steps are the top k of the values logged at the saved steps."""
    from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import RegressionDataset, make_trainer

    keeper = KeepBestCheckpoints(monitor, k=2, mode=mode)
    trainer = make_trainer(tmp_path, [TrainSubsetEvaluation(size=16, gap_metrics=True), keeper],
                           trainer_class=TrainerPlus, eval_strategy="steps", eval_steps=2, logging_steps=2,
                           save_strategy="steps", save_steps=2, max_steps=12, save_total_limit=1,
                           learning_rate=0.3)
    trainer.eval_dataset = {"a": RegressionDataset(8, seed=3), "b": RegressionDataset(8, seed=4)}
    trainer.train()
    logged = {record["step"]: record[monitor] for record in trainer.state.log_history if monitor in record}
    assert sorted(logged) == [2, 4, 6, 8, 10, 12]
    expected = sorted(logged, key=lambda step: (logged[step] if mode == "min" else -logged[step], step))[:2]
    assert [entry.step for entry in keeper.ranking[monitor]] == expected
    assert kept_steps(tmp_path) == sorted(expected)


def test_lightweight_trainer_keeps_its_checkpoints(tmp_path):
    from tests.callbacks.early_stopping_helpers import scripted_lightweight

    keeper = KeepBestCheckpoints("eval_score", k=2, mode="min")
    trainer = scripted_lightweight(tmp_path, lambda step: SCORE[step], callbacks=[keeper], max_steps=16,
                                   save_strategy="steps", save_steps=2, save_total_limit=1)
    trainer.train()
    assert kept_steps(tmp_path) == [6, 10] and checkpoint_steps(tmp_path) == [16]
    assert os.path.isfile(tmp_path / KEPT / "checkpoint-10" / "model_state.pkl")


# -- what is refused, and when --------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"monitor": "eval_loss", "k": 0}, ValueError, "k must be an int >= 1"),
    ({"monitor": "eval_loss", "k": True}, TypeError, "k must be an int >= 1"),
    ({"monitor": "eval_loss", "mode": "up"}, ValueError, "mode must be one of"),
    ({"monitor": "eval_los"}, ValueError, "Did you mean 'eval_loss'"),
    ({"monitor": "eval_score"}, ValueError, "Pass mode='min'"),
    ({"monitor": []}, TypeError, "non-empty list"),
    ({"monitor": ["eval_loss", "eval/loss"]}, ValueError, "listed twice"),
    ({"monitor": [TopK("eval_loss", k=-1)]}, ValueError, "k must be an int >= 1"),
    ({"monitor": [{"metric": "eval_loss"}]}, TypeError, "'monitor', 'k' and 'mode'"),
    ({"monitor": "eval_loss", "dirname": "checkpoint-best"}, ValueError, "not start with 'checkpoint'"),
    ({"monitor": "eval_loss", "dirname": "../elsewhere"}, ValueError, "one folder name inside output_dir"),
    ({"monitor": "eval_loss", "strict": "yes"}, TypeError, "strict must be True or False"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        KeepBestCheckpoints(**kwargs)


@pytest.mark.parametrize(("args", "words"), [
    ({"save_strategy": "no"}, "save_strategy='no' saves no checkpoint"),
    ({"eval_strategy": "no"}, "eval_strategy='no'"),
    ({"save_steps": 3}, "save_steps=3 is not a multiple of eval_steps=2"),
    ({"save_strategy": "epoch"}, "save_strategy='epoch'"),
])
def test_a_run_that_cannot_rank_is_refused_at_train_begin(tmp_path, args, words):
    trainer = scripted_run(tmp_path, [KeepBestCheckpoints("eval_score", mode="min")], score=SCORE, **args)
    with pytest.raises(ValueError, match=words):
        trainer.train()
    assert trainer.state.global_step == 0


def test_strict_false_warns_and_trains(tmp_path, caplog):
    keeper = KeepBestCheckpoints("eval_score", mode="min", strict=False)
    trainer = scripted_run(tmp_path, [keeper], score=SCORE, save_steps=3, max_steps=6)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert "not a multiple" in caplog.text and "strict=False" in caplog.text
    assert kept_steps(tmp_path) == [6]  # the one save that met an evaluation
    assert "saved checkpoint(s) (steps 3) had no value" in caplog.text


def test_a_metric_missing_from_the_first_evaluation_lists_the_keys(tmp_path):
    trainer = scripted_run(tmp_path, [KeepBestCheckpoints("eval_scor", mode="min")], score=SCORE)
    with pytest.raises(RuntimeError, match="eval_score"):
        trainer.train()
    assert trainer.state.global_step == 2 and kept_steps(tmp_path) == []


def test_two_instances_on_one_folder_are_refused(tmp_path):
    trainer = scripted_run(tmp_path, [KeepBestCheckpoints("eval_score", mode="min"),
                                      KeepBestCheckpoints("eval_loss")], score=SCORE)
    with pytest.raises(ValueError, match="same dirname"):
        trainer.train()


# -- agreement with load_best_model_at_end on infinities; when the rest is refused (issue 32, item 6) --
INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(("values", "greater_is_better"), [
    ({2: 0.5, 4: INF, 6: 0.9, 8: INF}, True),   # +Inf is the best accuracy; a second +Inf ties
    ({2: -INF, 4: 0.3, 6: 0.2, 8: NAN}, True),  # -Inf and NaN never best
    ({2: 0.5, 4: -INF, 6: 0.1, 8: NAN}, False),  # -Inf is the best loss
    ({2: INF, 4: 3.0, 6: INF, 8: 4.0}, False),  # +Inf never best
], ids=["+inf max", "-inf max", "-inf min", "+inf min"])
def test_infinities_rank_as_load_best_model_at_end_picks(tmp_path, values, greater_is_better):
    """Side by side in one real Trainer: our rank 1 is the trainer's best checkpoint; the top k is
    the independent ground truth."""
    keeper = KeepBestCheckpoints(k=2)  # monitor=None: metric_for_best_model, mode from greater_is_better
    trainer = scripted_run(tmp_path, [keeper], metric=values, max_steps=8, load_best_model_at_end=True,
                           metric_for_best_model="metric", greater_is_better=greater_is_better)
    trainer.train()
    mode = "max" if greater_is_better else "min"
    expected = expected_ranking({"metric": values}, [("metric", 2, mode)], sorted(values))["eval_metric"]
    assert [entry.step for entry in keeper.ranking["eval_metric"]] == expected
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{expected[0]}")


@pytest.mark.parametrize("wiring", ["TrainerPlus", "run_before_integrations", "stock Trainer"])
@pytest.mark.parametrize("monitor", ["score", "eval_score"])
def test_a_plain_metric_with_a_dict_of_eval_sets_is_refused_before_any_save(tmp_path, wiring, monitor):
    """A trainer that binds its callbacks (TrainerPlus, run_before_integrations) shows its eval
    datasets at train begin; a stock Trainer shows callbacks no dataset before it evaluates, so
    there it is the first evaluation: the trainer saves that step first (issue 41), nothing is kept,
    and the error names the checkpoint to resume from."""
    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import RegressionDataset

    keeper = KeepBestCheckpoints(monitor, mode="min")
    trainer = scripted_run(tmp_path, [] if wiring == "run_before_integrations" else [keeper],
                           trainer_class=TrainerPlus if wiring == "TrainerPlus" else None, score=SCORE)
    trainer.eval_dataset = {"a": RegressionDataset(8, seed=3), "b": RegressionDataset(8, seed=4)}
    if wiring == "run_before_integrations":
        run_before_integrations(trainer, keeper)
    error = RuntimeError if wiring == "stock Trainer" else ValueError
    words = "eval_a_score' or 'eval_b_score'" if error is ValueError else "named datasets"
    with pytest.raises(error, match=words) as refused:
        trainer.train()
    assert trainer.state.global_step == (2 if wiring == "stock Trainer" else 0)
    assert checkpoint_steps(tmp_path) == ([2] if wiring == "stock Trainer" else [])
    assert kept_steps(tmp_path) == []
    if wiring == "stock Trainer":
        assert f"resume_from_checkpoint='{tmp_path / 'checkpoint-2'}'" in str(refused.value)


def test_resumable_with_save_only_model_is_refused_at_train_begin(tmp_path):
    keeper = KeepBestCheckpoints("eval_score", mode="min", resumable=True)
    trainer = scripted_run(tmp_path, [keeper], score=SCORE, save_only_model=True)
    with pytest.raises(ValueError, match="resumable=True keeps what a resume needs, but args.save_only"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_values_logged_after_the_save_of_their_step_rank_it(tmp_path, caplog):
    """Evaluation by epoch, saves by steps (strict=False accepts it): the saves at the epochs' last
    steps (8, and the final step 16) are saved before their evaluation, which ranks them; the
    saves in between (4, 12) have no value and are told."""
    keeper = KeepBestCheckpoints("eval_score", k=2, mode="min", strict=False)
    weights = WeightsAtSave()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        scripted_run(tmp_path, [weights, keeper], score={8: 2.0, 16: 1.0}, eval_strategy="epoch",
                     save_steps=4, save_total_limit=1, num_train_epochs=2, max_steps=-1).train()
    assert [entry.step for entry in keeper.ranking["eval_score"]] == [16, 8]
    assert kept_steps(tmp_path) == [8, 16]
    for step in (8, 16):
        assert kept_weights(tmp_path / KEPT / f"checkpoint-{step}") == weights.weights[step]
    assert "2 saved checkpoint(s) (steps 4, 12) had no value" in caplog.text
