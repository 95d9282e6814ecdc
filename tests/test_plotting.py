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
from hf_callbacks_plus.loggers.jsonl import JsonlLogger  # noqa: E402
from hf_callbacks_plus.plotting import (  # noqa: E402
    FIXED_COLORS,
    collect_curves,
    load_log_history,
    plot_learning_curves,
)
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
        callbacks=[TrainSubsetEvaluation(size=16, gap_metrics=True), ReportEarlyStop(),
                   JsonlLogger(output / "logs" / "metrics.jsonl")],
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
    source = run_dir / "checkpoint-16" / "trainer_state.json"
    figure = plot_learning_curves(source, output, title="tiny run")
    assert output.read_bytes()[:8] == PNG_MAGIC
    visible = [axis for axis in figure.axes if axis.get_visible() and axis.get_title()]
    assert [axis.get_title() for axis in visible] == ["loss"]  # no monitor known: the loss alone
    figure = plot_learning_curves(source, output, title="tiny run", metrics="all")
    visible = [axis for axis in figure.axes if axis.get_visible() and axis.get_title()]
    assert [axis.get_title() for axis in visible] == ["loss", "mae", "mse"]
    (legend,) = figure.legends  # one legend for the figure
    labels = [text.get_text() for text in legend.get_texts()]
    expected = {"training loss", "eval", "train subset", "best step 8", "early stop 16", "gap (right axis)"}
    assert expected <= set(labels)
    assert len(labels) == len(set(labels))
    assert_legend_covers_no_panel(figure)


def assert_legend_covers_no_panel(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = [legend.get_window_extent(renderer) for legend in figure.legends]
    boxes += [axis.get_legend().get_window_extent(renderer) for axis in figure.axes if axis.get_legend()]
    assert boxes
    for box in boxes:
        for axis in figure.axes:
            if axis.get_visible():
                assert not box.overlaps(axis.get_window_extent(renderer)), (box, axis.get_title())


def line_colors(figure):
    """``{label: (colour, linestyle)}`` of every drawn line, checked to be the same on every panel."""
    out = {}
    for axis in figure.axes:
        for line in axis.get_lines():
            label = line.get_label()
            if label.startswith("_"):
                continue
            style = (line.get_color(), line.get_linestyle())
            assert out.setdefault(label, style) == style, label
    return out


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


def test_every_series_has_its_own_colour(tmp_path):
    history = [
        {"loss": 1.0, "step": 1},
        {"eval_a_acc": 0.5, "eval_a_runtime": 0.1, "eval_b_acc": 0.4, "eval_b_runtime": 0.1,
         "train_subset_acc": 0.6, "step": 2},
        {"val_acc": 0.45, "val_runtime": 0.1, "holdout_acc": 0.3, "holdout_runtime": 0.1, "step": 2},
        {"eval_a_acc": 0.55, "eval_b_acc": 0.42, "train_subset_acc": 0.7, "val_acc": 0.5, "holdout_acc": 0.35,
         "step": 4},
    ]
    figure = plot_learning_curves(history, tmp_path / "colours.png", metrics="all")
    colors = line_colors(figure)
    assert {"eval (a)", "eval (b)", "val", "holdout", "train subset", "training loss"} <= set(colors)
    assert len(set(colors.values())) == len(colors)  # a custom prefix never looks like the train subset
    assert colors["train subset"][0] == FIXED_COLORS["train subset"]
    assert_legend_covers_no_panel(figure)


def test_metric_names_bare_prefixed_and_rendered(run_dir, tmp_path):
    source = run_dir / "checkpoint-16" / "trainer_state.json"
    for names in (["mse"], ["eval_mse"], ["eval/mse"], ["train_subset_mse"], ["train_subset/mse"],
                  ["gap_mse"]):
        figure = plot_learning_curves(source, metrics=names)
        assert [axis.get_title() for axis in figure.axes if axis.get_title()] == ["mse"], names
    figure = plot_learning_curves(source, metrics=["eval/loss", "mae", "loss"])  # same panel once
    assert [axis.get_title() for axis in figure.axes if axis.get_title()] == ["loss", "mae"]
    with pytest.raises(ValueError, match=r"no curve for metrics \['eval/f1'\]"):
        plot_learning_curves(source, metrics=["eval/f1"])


def test_the_packages_jsonl_log_and_a_run_directory(run_dir, tmp_path):
    jsonl = run_dir / "logs" / "metrics.jsonl"
    assert len(jsonl.read_text().splitlines()) > 2  # several JSON documents: json.load alone fails
    from_state = collect_curves(*load_log_history(run_dir / "checkpoint-16" / "trainer_state.json"))
    for source in (jsonl, run_dir / "logs"):
        curves = collect_curves(*load_log_history(source))
        assert set(curves.series) == set(from_state.series)
        for name, series in from_state.series.items():
            assert set(curves.series[name]) == set(series), name
            for label, points in series.items():
                assert [s for s, _ in curves.series[name][label]] == [s for s, _ in points], (name, label)
                assert [v for _, v in curves.series[name][label]] == pytest.approx([v for _, v in points])
        assert (curves.best_step, curves.stopped_step) == (8, 16)
    assert plot_learning_curves(jsonl, tmp_path / "jsonl.png") is not None
    assert (tmp_path / "jsonl.png").read_bytes()[:8] == PNG_MAGIC


def test_a_jsonl_line_that_is_not_json_is_named(tmp_path):
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"event": "log", "step": 1, "curves": {"train/loss": 1.0}, "summary": {}}\n{oops\n')
    with pytest.raises(ValueError, match=r"line 2 is not JSON"):
        load_log_history(bad)
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"event": "log", "step": 1, "curves": {"train/loss": "NaN"}, "summary": {}}\n'
                   '{"event": "log", "step": 2, "curves": {"train/loss": 0.5}, "summary": {}}\n')
    points = collect_curves(*load_log_history(nan)).series["loss"]["training loss"]
    assert points[1] == (2, 0.5) and points[0][1] != points[0][1]  # NaN kept as a gap in the curve


# what trl 1.16's DPOTrainer logs (bare in training records, eval_ in evaluation records), with a
# train-subset evaluation and gap metrics of ours
DPO_HISTORY = [
    {"loss": 0.69, "rewards/chosen": 0.01, "rewards/rejected": -0.01, "rewards/accuracies": 0.5,
     "rewards/margins": 0.02, "logps/chosen": -40.0, "logps/rejected": -41.0, "logits/chosen": -1.0,
     "logits/rejected": -1.1, "mean_token_accuracy": 0.2, "entropy": 3.0, "num_tokens": 512.0,
     "grad_norm": 1.0, "learning_rate": 1e-4, "epoch": 0.5, "step": 2},
    {"eval_loss": 0.68, "eval_rewards/chosen": 0.02, "eval_rewards/accuracies": 0.55,
     "eval_mean_token_accuracy": 0.21,
     "eval_runtime": 0.1, "eval_samples_per_second": 10.0, "eval_steps_per_second": 1.0, "epoch": 0.5,
     "train_subset_loss": 0.66, "train_subset_rewards/chosen": 0.03, "train_subset_rewards/accuracies": 0.6,
     "gap_rewards/accuracies": 0.05, "step": 2},
    {"loss": 0.6, "rewards/chosen": 0.1, "rewards/accuracies": 0.7, "mean_token_accuracy": 0.25, "step": 4},
    {"eval_loss": 0.62, "eval_rewards/chosen": 0.08, "eval_rewards/accuracies": 0.65,
     "eval_mean_token_accuracy": 0.23,
     "eval_runtime": 0.1, "train_subset_loss": 0.58, "train_subset_rewards/chosen": 0.12,
     "train_subset_rewards/accuracies": 0.75, "gap_rewards/accuracies": 0.1, "step": 4},
    {"train_runtime": 3.0, "train_samples_per_second": 5.0, "train_steps_per_second": 1.0, "total_flos": 0.0,
     "train_loss": 0.65, "epoch": 1.0, "step": 4},
]


def test_trl_runs_draw_running_metrics_as_training_never_as_train_subset(tmp_path):
    curves = collect_curves(DPO_HISTORY)
    assert set(curves.series["rewards/accuracies"]) == {"training", "eval", "train subset", "gap"}
    assert curves.series["rewards/accuracies"]["training"] == [(2, 0.5), (4, 0.7)]
    assert curves.series["rewards/accuracies"]["train subset"] == [(2, 0.6), (4, 0.75)]
    assert set(curves.series["mean_token_accuracy"]) == {"training", "eval"}
    assert set(curves.series["loss"]) == {"training loss", "eval", "train subset"}
    assert "logps/chosen" in curves.series and "num_tokens" not in curves.series  # a counter: an extra
    assert not any(name.startswith(("runtime", "train_summary")) for name in curves.series)
    figure = plot_learning_curves(DPO_HISTORY, tmp_path / "dpo.png",
                                  metrics=["loss", "eval/rewards/accuracies", "mean_token_accuracy"])
    assert [axis.get_title() for axis in figure.axes if axis.get_title()] == [
        "loss", "rewards/accuracies", "mean_token_accuracy"]
    assert_legend_covers_no_panel(figure)


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
    # the package's JSONL log and a directory holding it; prefixed and rendered names
    for source in (run_dir / "logs" / "metrics.jsonl", run_dir / "logs", run_dir):
        command = ["plot", str(source), "-o", str(output), "-m", "eval_mse", "eval/mae", "loss"]
        assert main(command) == 0, source
        assert output.read_bytes()[:8] == PNG_MAGIC
    assert main(["plot", str(run_dir), "-o", str(output), "-m", "eval/nope"]) == 1
    assert "no curve for metrics ['eval/nope']" in capsys.readouterr().err


def test_a_binary_file_gets_a_clear_error_naming_it(tmp_path):
    from hf_callbacks_plus.plotting import plot_learning_curves

    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"model\.safetensors.*not a text file"):
        plot_learning_curves(str(path))


def test_the_quickstarts_plot_command_on_a_stock_trainer_run(tmp_path, capsys, caplog, monkeypatch):
    """A stock Trainer writes trainer_state.json only into its checkpoints: the run folder and
    ``runs/my-run/trainer_state.json`` plot the newest checkpoint's state (the path with a warning naming
    the file read); without ``-o`` the PNG goes into the run folder; a folder without any state says
    where a Trainer writes the file."""
    import logging

    run = tmp_path / "my-run"
    stock = make_trainer(run, eval_strategy="steps", eval_steps=4, logging_steps=2, max_steps=8,
                         save_strategy="steps", save_steps=4)
    stock.train()
    assert not (run / "trainer_state.json").exists()
    assert (run / "checkpoint-8" / "trainer_state.json").exists()
    for given in (run, run / "trainer_state.json"):
        output = tmp_path / f"{given.name}.png"
        with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
            assert main(["plot", str(given), "-o", str(output)]) == 0
        assert output.read_bytes().startswith(PNG_MAGIC)
    assert "plotting the newest checkpoint's" in caplog.text and "checkpoint-8" in caplog.text
    # without -o: learning_curves.png in the run folder read, never in the current folder (issue 41)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    checkpoint = run / "checkpoint-8"
    for given in (run, run / "trainer_state.json", checkpoint, checkpoint / "trainer_state.json"):
        (run / "learning_curves.png").unlink(missing_ok=True)
        capsys.readouterr()
        assert main(["plot", str(given)]) == 0, given
        assert (run / "learning_curves.png").read_bytes().startswith(PNG_MAGIC), given
        assert capsys.readouterr().out == f"wrote {run / 'learning_curves.png'}\n"
        assert not list(elsewhere.iterdir()), given
    empty = tmp_path / "empty"
    empty.mkdir()
    capsys.readouterr()
    assert main(["plot", str(empty / "trainer_state.json")]) == 1
    error = capsys.readouterr().err
    assert "does not exist" in error and "checkpoint-N" in error
    assert "Did you mean" not in error  # nothing near it to plot (the empty folder is no run)
    assert main(["plot", str(empty)]) == 1
    assert "save_state()" in capsys.readouterr().err


# -- the default figure: is it over-fitting, and where did it stop (issue 33 item 6) ------------------

@pytest.fixture(scope="module")
def story_run(tmp_path_factory):
    """A TrainerPlus run with every callback the default figure reads: the train subset with gaps,
    EarlyStopping on eval_mae (stops), KeepBestCheckpoints on eval_mse (k=2), ThroughputMonitor."""
    from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor

    output = tmp_path_factory.mktemp("story")
    stopper = EarlyStopping("eval_mae", patience=2, min_delta=0.5, verbose=False)
    keeper = KeepBestCheckpoints("eval_mse", k=2, verbose=False)
    trainer = make_trainer(
        output, trainer_class=TrainerPlus, eval_strategy="steps", eval_steps=2, logging_steps=2,
        max_steps=40, learning_rate=0.05, save_strategy="steps", save_steps=2,
        callbacks=[TrainSubsetEvaluation(size=16, gap_metrics=True), stopper, keeper, ThroughputMonitor()],
    )
    trainer.train()
    trainer.save_state()
    return output, trainer, stopper, keeper


def panels(figure):
    return {axis.get_title(): axis for axis in figure.axes if axis.get_visible() and axis.get_title()}


def lines_of(axis):
    return {line.get_label(): line for line in axis.get_lines() if not line.get_label().startswith("_")}


def test_the_default_figure_is_the_loss_and_the_monitored_metrics(story_run, tmp_path):
    output, trainer, stopper, keeper = story_run
    assert stopper.stopped  # the run stopped early: the figure must say where
    history = trainer.state.log_history
    for source in (output, output / "trainer_state.json", output / f"checkpoint-{trainer.state.global_step}"):
        figure = plot_learning_curves(source, tmp_path / "default.png")
        shown = panels(figure)
        assert list(shown) == ["loss", "mae (monitored)", "mse (monitored)"], source
    kept = sorted(entry.step for entry in keeper.entries)
    evaluations = [r for r in history if "eval_mae" in r]
    for title, name in (("mae (monitored)", "mae"), ("mse (monitored)", "mse"), ("loss", "loss")):
        drawn = lines_of(shown[title])
        # the curves are the logged values, read back from the figure
        assert list(drawn["eval"].get_xdata()) == [r["step"] for r in evaluations]
        assert list(drawn["eval"].get_ydata()) == pytest.approx([r[f"eval_{name}"] for r in evaluations])
        assert list(drawn["train subset"].get_ydata()) == pytest.approx(
            [r[f"train_subset_{name}"] for r in evaluations])
        assert list(drawn[f"best step {stopper.best_step}"].get_xdata()) == [stopper.best_step] * 2
        assert list(drawn[f"early stop {stopper.stopped_step}"].get_xdata()) == [stopper.stopped_step] * 2
        assert list(drawn[f"kept checkpoints ({len(kept)})"].get_xdata()) == kept
        (twin,) = [other for other in figure.axes if other is not shown[title] and other.get_shared_x_axes()
                   .joined(other, shown[title]) and other.get_ylabel().startswith("gap")]
        (gap,) = twin.get_lines()
        assert list(gap.get_ydata()) == pytest.approx([r[f"gap_{name}"] for r in evaluations])
    assert "training loss" in lines_of(shown["loss"])


def test_all_draws_every_curve_with_other_sections_named_in_full(story_run, tmp_path):
    output, trainer, _, _ = story_run
    figure = plot_learning_curves(output, tmp_path / "all.png", metrics="all")
    titles = list(panels(figure))
    assert titles[:3] == ["loss", "mae (monitored)", "mse (monitored)"]
    words = ("per_second", "seconds", "steps")
    throughput = [title for title in titles if any(word in title for word in words)]
    assert throughput and all(title.startswith("throughput/") for title in throughput)
    assert "throughput/samples_per_second" in titles  # a timing name, in a section of its own
    assert not any(title in ("runtime", "samples_per_second", "steps_per_second") for title in titles)
    records = [r for r in trainer.state.log_history if "throughput/samples_per_second" in r]
    for wanted in ("samples_per_second", "throughput/samples_per_second"):
        figure = plot_learning_curves(output, metrics=[wanted])
        (axis,) = panels(figure).values()
        assert axis.get_title() == "throughput/samples_per_second"
        assert list(lines_of(axis)["training"].get_ydata()) == pytest.approx(
            [r["throughput/samples_per_second"] for r in records])


def test_trl_num_tokens_is_a_counter_never_an_eval_curve():
    history = [dict(record) for record in DPO_HISTORY]
    for record in history:
        if "eval_loss" in record:
            record["eval_num_tokens"] = 1024.0  # trl's log adds the training counter to eval records
    curves = collect_curves(history)
    assert "num_tokens" not in curves.series
    with_extras = collect_curves(history, include_training_extras=True)
    assert set(with_extras.series["num_tokens"]) == {"training"}


def test_a_misspelt_metric_gets_a_did_you_mean(story_run, capsys):
    output, _, _, _ = story_run
    with pytest.raises(ValueError, match=r"no curve for metrics \['maee'\] \(did you mean 'mae'"):
        plot_learning_curves(output, metrics=["maee"])
    assert main(["plot", str(output), "-m", "mse", "acuracy"]) == 1
    assert "no curve for metrics ['acuracy']" in capsys.readouterr().err
    with pytest.raises(TypeError, match=r"did you mean \['mae'\]"):
        plot_learning_curves(output, metrics="mae")


def test_a_missing_path_suggests_what_is_near_it(story_run, tmp_path, capsys):
    output, trainer, _, _ = story_run
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "demo").symlink_to(output, target_is_directory=True)
    (runs / "notes").mkdir()
    cases = {
        runs / "dmeo": runs / "demo",  # a typo in the run's name
        runs / "demo" / "checkpoint-999" / "trainer_state.json": runs / "demo",  # a checkpoint not there
        runs / "dmeo" / "trainer_state.json": runs / "demo" / "trainer_state.json",
    }
    for missing, suggested in cases.items():
        assert main(["plot", str(missing), "-o", str(tmp_path / "x.png")]) == 1
        error = capsys.readouterr().err
        assert f"Did you mean {str(suggested)!r}?" in error, (missing, error)
    assert main(["plot", str(runs / "nothing-like-it"), "-o", str(tmp_path / "x.png")]) == 1
    assert "Did you mean" not in capsys.readouterr().err
    assert main(["plot", str(runs), "-o", str(tmp_path / "x.png")]) == 1  # a folder of runs
    assert f"It holds run folders: {str(runs / 'demo')!r}." in capsys.readouterr().err


def test_cli_all_and_the_default(story_run, tmp_path, capsys):
    output, _, _, _ = story_run
    assert main(["plot", str(output), "-o", str(tmp_path / "a.png"), "--all"]) == 0
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(SystemExit):
        main(["plot", str(output), "--all", "-m", "mse"])  # one or the other


def test_the_gap_is_shaded_only_where_it_means_something(tmp_path):
    """The one rule (gap_is_meaningful): a shaded gap on the loss and an accuracy, none on trl's
    entropy (a diagnostic with no better direction)."""
    history = [{"loss": 1.0, "step": 1}]
    for step in (2, 4):
        history.append({"eval_loss": 0.9, "eval_mean_token_accuracy": 0.3, "eval_entropy": 2.0,
                        "eval_runtime": 0.1, "train_subset_loss": 0.7,
                        "train_subset_mean_token_accuracy": 0.4, "train_subset_entropy": 1.5, "step": step})
    figure = plot_learning_curves(history, metrics=["loss", "mean_token_accuracy", "entropy"])
    shaded = {title: any(collection.get_label() == "gap (shaded)" for collection in axis.collections)
              for title, axis in panels(figure).items()}
    assert shaded == {"loss": True, "mean_token_accuracy": True, "entropy": False}
