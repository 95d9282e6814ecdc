"""The demo-sized training on 2 ranks (CPU, gloo): examples/distributed.py.

Under torchrun it is one scenario of the session's torchrun launch (tests/distributed.py);
under ``accelerate launch`` (the same two processes through torch elastic, with accelerate's
environment) it is the command itself, in the second tier.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.examples.conftest import EXAMPLES, TINY, example_env, load_example, run_command

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow, pytest.mark.wandb]

ACCELERATE = Path(sys.executable).with_name("accelerate")
#: min_delta=10: every evaluation after the first is a non-improvement, so with patience 2 the
#: stop is at the third evaluation (step 9 on 2 ranks x 16 samples per step).
ARGUMENTS = [*TINY, "--epochs", "10", "--patience", "2", "--min-delta", "10", "--eval-batch-size", "8"]


def two_ranks_run_the_demo(out: Path) -> None:
    """``examples/distributed.py``'s ``main`` on both ranks, as ``torchrun`` runs the command."""
    os.environ.update(example_env(out))
    load_example("distributed").main([*ARGUMENTS, "--runs-dir", str(out)])


@pytest.mark.distributed(scenario=two_ranks_run_the_demo)
def test_two_ranks_one_tracker_run_same_stop_step_subset_split(distributed_outcome):
    check_two_rank_demo(distributed_outcome.dir, distributed_outcome.outputs())


@pytest.mark.second_tier
def test_two_ranks_under_accelerate_launch(tmp_path):
    # ``accelerate launch --cpu`` starts ONE process (its CPU multi-process path needs mpirun);
    # ``--multi_gpu`` starts 2 through torch elastic and the script's ``TrainingArguments(use_cpu=True)``
    # makes them a gloo (MULTI_CPU) group.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
               str(EXAMPLES / "distributed.py"), *ARGUMENTS, "--runs-dir", str(tmp_path)]
    result = run_command(tmp_path, command, timeout=300)
    check_two_rank_demo(tmp_path, result.stdout)


def check_two_rank_demo(runs_dir: Path, stdout: str) -> None:
    ranks = [json.loads((runs_dir / "distributed" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]

    # the same early-stopping decision at the same step on both ranks
    assert [(r["stopped_step"], r["global_step"], r["reason"]) for r in ranks] == [(9, 9, "PATIENCE")] * 2
    assert stdout.count("Demo finished") == 1  # the summary is printed by rank 0 only

    # one tracker run: rank 0 logs, rank 1 never starts a run
    assert ranks[0]["mlflow_run_id"] and ranks[1]["mlflow_run_id"] is None
    assert ranks[0]["wandb_run_id"] and ranks[1]["wandb_run_id"] is None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs_dir}/mlflow.db")
    experiment = client.get_experiment_by_name("hf-callbacks-plus-demo")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [ranks[0]["mlflow_run_id"]]
    history = client.get_metric_history(runs[0].info.run_id, "train_subset/accuracy")
    assert [m.step for m in history] == [3, 6, 9]
    assert len(list((runs_dir / "wandb").glob("offline-run-*"))) == 1
    jsonl = runs_dir / "distributed" / "metrics.jsonl"
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
