"""plot_learning_curves and the `hf-callbacks-plus plot` command, on a real training run."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation  # noqa: E402
from hf_callbacks_plus.cli import main  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from hf_callbacks_plus.plotting import collect_curves, load_log_history, plot_learning_curves  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class ReportEarlyStop(TrainerCallback):
    """Reports early-stopping keys in the contract's format (as EarlyStopping does) and stops."""

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        if "eval_loss" in logs:
            logs["early_stopping/best_step"] = 8
            if state.global_step >= 16:
                logs["early_stopping/stopped_step"] = state.global_step
                control.should_training_stop = True


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    output = tmp_path_factory.mktemp("run")
    trainer = make_trainer(
        output, trainer_class=TrainerPlus, eval_strategy="steps", eval_steps=4, logging_steps=2,
        max_steps=24, learning_rate=0.05, save_strategy="steps", save_steps=4,
        callbacks=[TrainSubsetEvaluation(size=16, gap_metrics=True), ReportEarlyStop()],
    )
    trainer.train()
    return output


def test_curves_from_a_real_run(run_dir):
    history, state = load_log_history(run_dir)  # newest checkpoint's trainer_state.json
    curves = collect_curves(history, state)
    assert set(curves.series) == {"loss", "mse", "mae"}
    assert set(curves.series["mse"]) == {"eval", "train subset", "gap"}
    assert set(curves.series["loss"]) == {"training loss", "eval", "train subset", "gap"}
    assert [step for step, _ in curves.series["mse"]["eval"]] == [4, 8, 12, 16]
    assert curves.best_step == 8 and curves.stopped_step == 16
    assert len(curves.series["loss"]["training loss"]) == 8  # logged every 2 steps up to 16


def test_png_written(run_dir, tmp_path):
    output = tmp_path / "curves.png"
    figure = plot_learning_curves(run_dir / "checkpoint-16" / "trainer_state.json", output, title="tiny run")
    assert output.read_bytes()[:8] == PNG_MAGIC
    visible = [axis for axis in figure.axes if axis.get_visible() and axis.get_title()]
    assert [axis.get_title() for axis in visible] == ["loss", "mae", "mse"]
    legend = next(axis.get_legend() for axis in figure.axes if axis.get_legend() and axis.bbox.bounds ==
                  visible[2].bbox.bounds)
    labels = {text.get_text() for text in legend.get_texts()}
    assert {"eval", "train subset", "best step 8", "early stop 16", "gap (right)"} <= labels


def test_several_eval_datasets_and_custom_prefix():
    history = [
        {"loss": 1.0, "step": 1},
        {"eval_a_acc": 0.5, "eval_a_runtime": 0.1, "eval_b_acc": 0.4, "eval_b_runtime": 0.1, "step": 2},
        {"val_acc": 0.45, "val_runtime": 0.1, "step": 2},
        {"train_runtime": 1.0, "train_loss": 0.9, "step": 2},  # end-of-training summary: skipped
    ]
    curves = collect_curves(history)
    assert set(curves.series["acc"]) == {"eval (a)", "eval (b)", "val"}
    assert set(curves.series["loss"]) == {"training loss"}


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"no curve for metrics \['f1'\]; available: \['loss'"):
        plot_learning_curves([{"loss": 1.0, "step": 1}], metrics=["f1"])
    with pytest.raises(ValueError, match="no metric to plot"):
        plot_learning_curves([])
    with pytest.raises(FileNotFoundError, match="no trainer_state.json"):
        plot_learning_curves(tmp_path)
    with pytest.raises(TypeError, match="source must be"):
        plot_learning_curves(42)


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"hf-callbacks-plus\[plot\]"):
        plot_learning_curves([{"loss": 1.0, "step": 1}])


def test_cli_plot(run_dir, tmp_path, capsys):
    output = tmp_path / "cli.png"
    assert main(["plot", str(run_dir / "checkpoint-16" / "trainer_state.json"), "-o", str(output)]) == 0
    assert output.read_bytes()[:8] == PNG_MAGIC
    assert "wrote" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "missing.json"), "-o", str(output)]) == 1
    assert "does not exist" in capsys.readouterr().err
    state = json.loads((run_dir / "checkpoint-16" / "trainer_state.json").read_text())
    (tmp_path / "s.json").write_text(json.dumps(state))
    assert main(["plot", str(tmp_path / "s.json"), "-o", str(output), "-m", "mse", "--extras"]) == 0
