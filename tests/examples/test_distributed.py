"""The demo-sized training under `torchrun --nproc_per_node 2` (CPU, gloo): examples/distributed.py."""

from __future__ import annotations

import json
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.examples.conftest import TINY, run_example

pytestmark = [pytest.mark.distributed, pytest.mark.transformers, pytest.mark.mlflow, pytest.mark.wandb,
              pytest.mark.slow]

TORCHRUN = Path(sys.executable).with_name("torchrun")
ACCELERATE = Path(sys.executable).with_name("accelerate")


def launcher(name):
    """The command starting 2 CPU processes. ``accelerate launch --cpu`` starts ONE process (its
    CPU multi-process path needs mpirun); ``--multi_gpu`` starts 2 through torch elastic and the
    script's ``TrainingArguments(use_cpu=True)`` makes them a gloo (MULTI_CPU) group."""
    if name == "torchrun":
        return [str(TORCHRUN), "--standalone", "--nproc_per_node", "2"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]


@pytest.mark.parametrize("launch", ["torchrun", "accelerate"])
def test_two_ranks_one_tracker_run_same_stop_step_subset_split(tmp_path, launch):
    # min_delta=10: every evaluation after the first is a non-improvement, so with patience 2
    # the stop is at the third evaluation (step 9 on 2 ranks x 16 samples per step).
    result = run_example(
        tmp_path, "distributed.py", *TINY, "--runs-dir", str(tmp_path), "--epochs", "10",
        "--patience", "2", "--min-delta", "10", "--eval-batch-size", "8",
        command=launcher(launch), timeout=300,
    )
    ranks = [json.loads((tmp_path / "distributed" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]

    # the same early-stopping decision at the same step on both ranks
    assert [(r["stopped_step"], r["global_step"], r["reason"]) for r in ranks] == [(9, 9, "PATIENCE")] * 2
    assert result.stdout.count("Demo finished") == 1  # the summary is printed by rank 0 only

    # one tracker run: rank 0 logs, rank 1 never starts a run
    assert ranks[0]["mlflow_run_id"] and ranks[1]["mlflow_run_id"] is None
    assert ranks[0]["wandb_run_id"] and ranks[1]["wandb_run_id"] is None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("hf-callbacks-plus-demo")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [ranks[0]["mlflow_run_id"]]
    history = client.get_metric_history(runs[0].info.run_id, "train_subset/accuracy")
    assert [m.step for m in history] == [3, 6, 9]
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1
    jsonl = tmp_path / "distributed" / "metrics.jsonl"
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    steps = [line["step"] for line in lines if line["event"] == "log" and "eval/loss" in line["curves"]]
    assert steps == [3, 6, 9]

    # the train subset is split across ranks: each sample evaluated by exactly one rank
    subset = Counter(map(tuple, ranks[0]["subset_rows"]))
    assert ranks[0]["subset_rows"] == ranks[1]["subset_rows"] and sum(subset.values()) == 32
    evaluations = ranks[0]["subset_evaluations"]
    assert evaluations == 3
    assert all(len(r["evaluated_rows"]) == 16 * evaluations for r in ranks)  # half each
    evaluated = Counter(map(tuple, ranks[0]["evaluated_rows"] + ranks[1]["evaluated_rows"]))
    assert evaluated == Counter({row: count * evaluations for row, count in subset.items()})
