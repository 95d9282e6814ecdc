"""ConsoleSummary: one line per evaluation and per training record in a stock Trainer (wired with
``run_before_integrations``), TrainerPlus and LightweightTrainer, under either printer
(``PrinterCallback`` with ``disable_tqdm=True``, ``ProgressCallback`` under the bar).

Side by side with the same run without it: the records (``state.log_history``) are identical,
the printer's dicts of the records the line says are gone, the others stay. Each number of the
line is checked against the record it came from, the best so far against a running best
recomputed from ``log_history``.
"""

from __future__ import annotations

import logging
import math
import re

import pytest

from hf_callbacks_plus.callbacks.console_summary import ConsoleSummary
from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

TIMING = ("runtime", "per_second", "preparation_time", "window_seconds", "left_out_seconds")
EVAL = re.compile(r"^step (\d+)/(\d+) \(epoch [\d.]+\) \| eval_loss (\S+) \(subset (\S+), gap (\S+)\) "
                  r"best (\S+) @ (\d+)( new| wait \d+/\d+)")


def stock_or_plus(tmp_path, callbacks, how, tqdm):
    pytest.importorskip("transformers")
    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import make_trainer

    trainer = make_trainer(tmp_path, callbacks=callbacks,
                           trainer_class=TrainerPlus if how == "plus" else None, max_steps=12,
                           eval_strategy="steps", eval_steps=4, logging_steps=2, disable_tqdm=not tqdm,
                           learning_rate=0.05)
    if how == "stock":
        run_before_integrations(trainer)
    return trainer


def loop(tmp_path, callbacks, tqdm):
    if tqdm:
        pytest.importorskip("tqdm")
    data = [[float(i % 5), float(i % 3)] for i in range(16)]
    args = LoopArguments(output_dir=str(tmp_path), max_steps=12, logging_steps=2, eval_steps=4,
                         eval_strategy="steps", save_strategy="no", disable_tqdm=not tqdm)
    return LightweightTrainer(args, train_step=lambda batch: float(sum(batch)) / 10, train_data=data,
                              eval_data=[[1.0, 2.0], [0.5, 1.5]],
                              eval_step=lambda batch: float(sum(batch)) / 7, callbacks=callbacks,
                              learning_rate_fn=lambda: 0.01)


def build(how, tmp_path, callbacks, tqdm):
    if how == "loop":
        return loop(tmp_path, callbacks, tqdm)
    return stock_or_plus(tmp_path, callbacks, how, tqdm)


def records(trainer):
    return [{k: v for k, v in record.items() if not any(t in k for t in TIMING)}
            for record in trainer.state.log_history]


def run(how, tmp_path, capsys, tqdm, with_summary, **options):
    callbacks = [TrainSubsetEvaluation(size=4, seed=0),
                 EarlyStopping("eval_loss", patience=50, verbose=False)]
    if with_summary:
        callbacks.append(ConsoleSummary(**options))
    trainer = build(how, tmp_path / str(with_summary), callbacks, tqdm)
    capsys.readouterr()
    trainer.train()
    return trainer, capsys.readouterr().out


def dicts_printed(out):
    return [line for line in out.splitlines() if line.lstrip().startswith("{")]


@pytest.mark.parametrize("tqdm", [False, True], ids=["printer", "progress"])
@pytest.mark.parametrize("how", ["stock", "plus", "loop"])
def test_one_line_per_evaluation_instead_of_the_dict(how, tqdm, tmp_path, capsys):
    baseline, stock_out = run(how, tmp_path, capsys, tqdm, with_summary=False)
    trainer, out = run(how, tmp_path, capsys, tqdm, with_summary=True)
    assert records(trainer) == records(baseline)  # the record is untouched: trackers get every key
    evaluations = [r for r in trainer.state.log_history if "eval_loss" in r]
    training = [r for r in trainer.state.log_history if "loss" in r and "eval_loss" not in r]
    assert len(dicts_printed(stock_out)) == len(evaluations) + len(training) + 1  # what the printer said
    # the printer now says only what no line says: the end-of-training totals
    printed = dicts_printed(out)
    assert len(printed) == 1 and "train_runtime" in printed[0]
    eval_lines = [EVAL.match(line) for line in out.splitlines() if "eval_loss" in line]
    assert len(eval_lines) == len(evaluations) and all(eval_lines)
    best = None
    for match, record in zip(eval_lines, evaluations):
        step, total, value, subset, gap, best_value, best_step, verdict = match.groups()
        assert (int(step), int(total)) == (record["step"], 12)
        assert value == f"{record['eval_loss']:.4g}" and subset == f"{record['train_subset_loss']:.4g}"
        assert float(gap) == pytest.approx(record["train_subset_loss"] - record["eval_loss"], rel=1e-3)
        if best is None or record["eval_loss"] < best[0]:  # the running best, recomputed
            best = (record["eval_loss"], record["step"])
        assert (best_value, int(best_step)) == (f"{best[0]:.4g}", best[1])
        assert (verdict == " new") == (best[1] == record["step"])
    train_lines = [line for line in out.splitlines() if line.startswith("step ") and "| loss " in line]
    assert len(train_lines) == len(training)
    for line, record in zip(train_lines, training):
        assert line.startswith(f"step {record['step']}/12 ")
        assert f"| loss {record['loss']:.4g}" in line and f"| lr {record['learning_rate']:.3g}" in line


@pytest.mark.parametrize("how", ["stock", "plus", "loop"])
def test_opting_out_of_the_quieting_and_of_the_training_lines(how, tmp_path, capsys):
    trainer, out = run(how, tmp_path, capsys, False, with_summary=True, quiet_printer=False, training=False)
    evaluations = [r for r in trainer.state.log_history if "eval_loss" in r]
    training = [r for r in trainer.state.log_history if "loss" in r and "eval_loss" not in r]
    assert len(dicts_printed(out)) == len(evaluations) + len(training) + 1  # the printer says everything
    assert len([line for line in out.splitlines() if EVAL.match(line)]) == len(evaluations)
    assert not [line for line in out.splitlines() if line.startswith("step ") and "| loss " in line]


def test_training_false_leaves_the_training_records_to_the_printer(tmp_path, capsys):
    trainer, out = run("plus", tmp_path, capsys, False, with_summary=True, training=False)
    training = [r for r in trainer.state.log_history if "loss" in r and "eval_loss" not in r]
    assert len(dicts_printed(out)) == len(training) + 1
    assert all("'loss'" in line or "train_runtime" in line for line in dicts_printed(out))


def test_a_stock_trainer_not_wired_prints_both_and_says_how_to_quiet_it(tmp_path, capsys, caplog):
    pytest.importorskip("transformers")
    from tests.tiny_models import make_trainer

    trainer = make_trainer(tmp_path, callbacks=[ConsoleSummary()], max_steps=4, eval_strategy="steps",
                           eval_steps=2, logging_steps=2, disable_tqdm=True)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("step 2/4 | eval_loss")
                or line.startswith("step 2/4 (epoch")]) == 2  # the training and the evaluation line
    assert len(dicts_printed(out)) == 5  # and the printer's dicts
    warnings = [r.getMessage() for r in caplog.records if "ConsoleSummary" in r.getMessage()]
    assert len(warnings) == 1 and "run_before_integrations(trainer)" in warnings[0]


def test_throughput_and_the_monitored_metric_lead_the_line(tmp_path, capsys):
    """With ``ThroughputMonitor``: the eval line shows the latest training record's figures; the
    monitored metric (here ``KeepBestCheckpoints``' ``eval_mse``, a minimum) leads, then the loss."""
    pytest.importorskip("transformers")
    from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
    from hf_callbacks_plus.callbacks.console_summary import _rate
    from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor

    callbacks = [TrainSubsetEvaluation(size=4, seed=0, gap_metrics=["mse"]), ThroughputMonitor(),
                 KeepBestCheckpoints("eval_mse", verbose=False), ConsoleSummary()]
    trainer = stock_or_plus(tmp_path, callbacks, "plus", tqdm=False)
    trainer.args.save_strategy, trainer.args.save_steps = "steps", 4
    trainer.train()
    out = capsys.readouterr().out
    history = trainer.state.log_history
    lines = [line for line in out.splitlines() if "| eval_mse" in line]
    assert len(lines) == len([r for r in history if "eval_mse" in r]) == 3
    assert "sequences/s" in lines[-1]
    for line in lines:
        step = int(line.split()[1].split("/")[0])
        record = next(r for r in history if r.get("step") == step and "eval_mse" in r)
        figures = [r for r in history if "throughput/sequences_per_second" in r and r["step"] <= step]
        expected = (f"eval_mse {record['eval_mse']:.4g} (subset {record['train_subset_mse']:.4g}, "
                    f"gap {record['gap_mse']:+.4g})")
        assert line.split(" | ")[1].startswith(expected)
        assert "| eval_loss " in line
        if figures:
            assert line.endswith(f"| {_rate(figures[-1]['throughput/sequences_per_second'])} sequences/s")


@pytest.mark.parametrize(("callbacks", "args", "expected"), [
    ([ConsoleSummary("eval_mae")], {}, "eval_mae"),
    ([EarlyStopping("eval_mae", verbose=False), ConsoleSummary()], {}, "eval_mae"),
    ([ConsoleSummary()], {"metric_for_best_model": "mae"}, "eval_mae"),
    ([ConsoleSummary()], {}, "eval_loss"),
])
def test_which_metric_leads(callbacks, args, expected):
    class Args:
        metric_for_best_model = args.get("metric_for_best_model")

    class Trainer:
        callback_handler = type("Handler", (), {"callbacks": callbacks})()

    trainer = Trainer()  # the summary holds it weakly
    summary = next(c for c in callbacks if isinstance(c, ConsoleSummary)).bind(trainer)
    record = {"eval_loss": 1.0, "eval_mae": 0.5, "eval_runtime": 0.1, "train_subset_mae": 0.25,
              "train_subset_confusion_0_1": 3.0, "eval_confusion_0_1": 5.0}
    line = summary.evaluation_line(record, None, Args())
    assert line.metrics[0].key == expected
    assert {m.key for m in line.metrics} == {expected, "eval_loss"}
    if expected == "eval_mae":
        mae = line.metrics[0]
        assert (mae.subset, mae.gap) == (0.25, -0.25)  # not logged: computed, a gap that means something


def test_best_follows_the_metric_direction_and_skips_non_finite_values():
    summary = ConsoleSummary("eval_accuracy")
    bests = []
    for step, value in enumerate([0.5, 0.7, math.nan, 0.6, 0.7, 0.8], start=1):
        record = {"eval_accuracy": value, "eval_runtime": 0.1}
        line = summary.evaluation_line(record, None, None, remember=True)
        bests.append((line.best, line.new_best))
        summary._last = None
    assert bests == [((0.5, 0), True), ((0.7, 0), True), ((0.7, 0), False), ((0.7, 0), False),
                     ((0.7, 0), False), ((0.8, 0), True)]


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="monitor must be"):
        ConsoleSummary(monitor="")
    with pytest.raises(TypeError, match=r"did you mean \['accuracy'\]"):
        ConsoleSummary(metrics="accuracy")
    with pytest.raises(TypeError, match="quiet_printer must be True or False"):
        ConsoleSummary(quiet_printer="yes")


def test_a_resumed_run_starts_from_the_best_of_its_history(tmp_path, capsys):
    """Without an EarlyStopping to ask, the best so far of a resumed run is rebuilt from the
    checkpoint's ``log_history``: the lines after the resume equal those of the run that was
    never interrupted."""
    pytest.importorskip("transformers")
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import make_trainer

    def lines(trainer, **train):
        capsys.readouterr()
        trainer.train(**train)
        return [line for line in capsys.readouterr().out.splitlines() if "| eval_loss" in line]

    common = dict(trainer_class=TrainerPlus, max_steps=12, eval_strategy="steps", eval_steps=2,
                  logging_steps=2, save_strategy="steps", save_steps=2, learning_rate=1.0)
    whole = lines(make_trainer(tmp_path / "whole", callbacks=[ConsoleSummary()], **common))
    resumed = lines(make_trainer(tmp_path / "whole", callbacks=[ConsoleSummary()], **common),
                    resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-6"))
    assert len(whole) == 6 and resumed == whole[3:]
    assert resumed[0].endswith("@ 4")  # the best is step 4's, before the checkpoint: from the history


def test_the_lines_shown_in_the_docs_are_what_the_callback_prints():
    """docs/console.md shows a real run's lines: each is rebuilt from its numbers by the
    formatting code, so a change of format fails here until the page shows the new one."""
    from pathlib import Path

    from hf_callbacks_plus.callbacks.console_summary import EvaluationLine, Shown

    page = (Path(__file__).resolve().parents[2] / "docs" / "console.md").read_text(encoding="utf-8")
    lines = [line for line in page.splitlines() if line.startswith("step ")]
    assert len(lines) >= 5
    head = re.compile(r"^step (\d+)/(\d+) \(epoch ([\d.]+)\) \| ")
    shown = re.compile(r"(\w+) (\S+) \(subset (\S+), gap (\S+)\)")
    summary = ConsoleSummary(metrics=["accuracy"])
    for text in lines:
        step, total, epoch = head.match(text).groups()
        fields = {"global_step": int(step), "max_steps": int(total), "epoch": float(epoch)}
        state = type("State", (), fields)()
        parts = text.split(" | ")[1:]
        rates = dict(reversed(item.split(" ", 1)) for item in parts[-1].split(", "))
        throughput = {label: float(value[:-1]) * 1000 if value.endswith("k") else float(value)
                      for label, value in rates.items()}
        if "| eval_loss" in text:
            metrics = [Shown(m[0], m[0][5:], float(m[1]), float(m[2]), float(m[3]))
                       for m in (shown.match(part).groups() for part in parts[:-1])]
            best = re.search(r"best (\S+) @ (\d+)( new| wait (\d+)/(\d+))", parts[0]).groups()
            line = EvaluationLine(int(step), metrics, (float(best[0]), int(best[1])), best[2] == " new",
                                  None if best[2] == " new" else (int(best[3]), int(best[4])), throughput)
            rebuilt = summary.format_evaluation(line, state)
        else:
            values = dict(part.split(" ") for part in parts[:-1])
            logs = {"loss": float(values["loss"]), "learning_rate": float(values["lr"]),
                    "grad_norm": float(values["grad_norm"]),
                    **{f"throughput/{key}": throughput[label] for key, label in
                       (("sequences_per_second", "sequences/s"), ("tokens_per_second", "tokens/s"))}}
            rebuilt = summary.format_training(logs, state)
        assert rebuilt == text
