"""`make demo` (examples/demo.py) end to end, at tiny sizes: real Trainer, MLflow, W&B offline.

At its default size (what `make demo` shows) in the second tier, as the command it is.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.examples.conftest import EXAMPLES, ROOT, TINY, run_command
from tests.test_docs_console import console_blocks

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow, pytest.mark.wandb]


#: Run a script as ``python <script> <args>`` does, then say whether DeepSpeed was imported.
RUN_AND_REPORT_DEEPSPEED = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
    "print('deepspeed imported:', sys.modules.get('deepspeed') is not None)"
)

#: Every line `make demo` prints outside its closing summary: the evaluation and training lines
#: (ConsoleSummary), the end-of-training record (transformers' printer), EarlyStopping's and
#: KeepBestCheckpoints' messages.
DEMO_LINES = re.compile(
    r"step \d+/\d+ \(epoch [\d.]+\) \| .*"
    r"|\{'train_runtime': .*\}"
    r"|EarlyStopping stopped training at step \d+: .*"
    r"|EarlyStopping summary: .*"
    r"|KeepBestCheckpoints: kept in .*"
    r"|  eval_accuracy \(max, k=2\): .*"
)


def test_demo_stops_early_reports_why_and_fills_every_tracker_section(tmp_path):
    """`make demo`'s command, at tiny sizes (its own defaults otherwise: every tracker, the plot).

    The console holds only the demo's own lines (issue 41): no progress-bar fragment (transformers'
    bars, the datasets' and the checkpoint shards'), nothing of DeepSpeed, which is not even
    imported (accelerate imports an installed DeepSpeed in every Trainer; `make` installs it for
    the tests), no MLflow INFO line, no "[INFO] Running in WANDB offline mode".
    """
    # min_delta=10 makes every evaluation after the first a non-improvement: with patience 2
    # the stop is at the third evaluation, step 9, whatever the model learns.
    command = [sys.executable, "-c", RUN_AND_REPORT_DEEPSPEED, str(EXAMPLES / "demo.py"), *TINY,
               "--runs-dir", str(tmp_path), "--epochs", "10", "--patience", "2", "--min-delta", "10"]
    result = run_command(tmp_path, command, unset=("WANDB_MODE",))  # make demo's environment
    out, err = result.stdout, result.stderr
    assert out.endswith("deepspeed imported: False\n"), out[-300:]
    assert "\r" not in out + err, "a progress bar drew on the console"
    summary = out.index("=" * 78)
    stray = [line for line in out[:summary].splitlines() + err.splitlines()
             if line.strip() and not DEMO_LINES.fullmatch(line)]
    assert not stray, stray
    assert "stopped training at step 9" in out, out
    assert "Best eval_loss" in out and "at step 3." in out
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db" in out

    # the console: one line per evaluation (ConsoleSummary), no dict of the record
    assert re.search(r"^step 9/\d+ \(epoch [\d.]+\) \| eval_loss \S+ \(subset \S+, gap [-+]\S+\) "
                     r"best \S+ @ 3 wait 2/2 \| eval_accuracy \S+ \(subset \S+, gap [-+]\S+\) \| "
                     r"\S+ sequences/s, \S+ tokens/s$", out, re.M), out
    assert "{'eval_loss'" not in out and "{'loss'" not in out

    run_dir = tmp_path / "demo"
    assert (run_dir / "learning_curves.png").stat().st_size > 10_000
    from hf_callbacks_plus.plotting import plot_learning_curves

    figure = plot_learning_curves(run_dir)  # what the demo drew: the default figure
    assert [axis.get_title() for axis in figure.axes if axis.get_visible() and axis.get_title()] == [
        "loss (monitored)", "accuracy (monitored)"]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 9
    evals = [r for r in state["log_history"] if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6, 9]
    assert all("train_subset_accuracy" in r and "gap_accuracy" in r for r in evals)
    assert evals[-1]["early_stopping/stopped_step"] == 9

    from mlflow.tracking import MlflowClient

    run_id = re.search(r"\(run ([0-9a-f]{32})\)", out).group(1)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("eval/loss", "eval/accuracy", "train_subset/accuracy", "train_subset/loss", "train/loss",
                "gap/accuracy", "early_stopping/best_step"):
        assert [m.step for m in client.get_metric_history(run_id, key)][-1] in (6, 9), key
    assert [m.step for m in client.get_metric_history(run_id, "eval/accuracy")] == [3, 6, 9]
    assert "train/train_subset_accuracy" not in run.data.metrics and "train/accuracy" not in run.data.metrics

    from hf_callbacks_plus.testing import read_wandb_run

    wandb_run = read_wandb_run(tmp_path / "wandb", wait=10)
    assert wandb_run.exit_code == 0
    assert wandb_run.steps("eval/accuracy") == [3, 6, 9]
    assert wandb_run.steps("train_subset/accuracy") == [3, 6, 9]

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = {key for line in lines if line["event"] == "log" for key in line["curves"]}
    assert {"eval/loss", "train_subset/accuracy", "gap/accuracy", "early_stopping/wait"} <= logged


@pytest.mark.second_tier
def test_demo_at_default_settings_overfits_visibly_and_stops_on_its_own(tmp_path):
    # what `make demo` shows, asserted: nothing forced (default sizes, patience and min_delta);
    # only the trackers are reduced to the embedded JSONL one to keep the test short.
    result = run_command(tmp_path, [sys.executable, str(EXAMPLES / "demo.py"), "--runs-dir", str(tmp_path),
                                    "--no-progress", "--no-plot", "--trackers", "jsonl"], timeout=400)
    state = json.loads((tmp_path / "demo" / "trainer_state.json").read_text())
    evals = [r for r in state["log_history"] if "eval_loss" in r]
    stop = evals[-1]
    assert stop["early_stopping/reason"] == "patience", stop
    assert stop["early_stopping/best_step"] < stop["early_stopping/stopped_step"] == state["global_step"]
    assert state["global_step"] < state["max_steps"]  # stopped early, not at the end of the budget
    # the train-subset curve pulls away from the eval curve: the gap grows and ends clearly positive
    first_gap, last_gap = evals[0]["gap_accuracy"], stop["gap_accuracy"]
    assert last_gap > first_gap + 0.05 and last_gap > 0.1, (first_gap, last_gap)
    assert stop["train_subset_accuracy"] > stop["eval_accuracy"]
    assert "Early stopping (PATIENCE)" in result.stdout
    # docs/console.md shows this run's lines (one torch thread: the same numbers on every run of a
    # machine; the throughput is the machine's own); regenerate the block from `make demo` if not
    (block,) = console_blocks(ROOT / "docs" / "console.md")
    shown = {without_throughput(line) for line in block if line.startswith(("step ", "EarlyStopping "))}
    printed = {without_throughput(line) for line in (result.stdout + result.stderr).splitlines()}
    assert shown <= printed, sorted(shown - printed)


def without_throughput(line: str) -> str:
    return re.sub(r" \| \S+ sequences/s, \S+ tokens/s$", "", line)
