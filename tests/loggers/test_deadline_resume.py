"""A run stopped by Deadline on a real signal and resumed is one MLflow run (a real sqlite store, read
back with ``MlflowClient``) holding every (key, step) once, with the uninterrupted run's values; the
preempted session closes it FINISHED with ``deadline/reason`` naming the signal, the resumed one
reopens it (RUNNING) and closes it FINISHED with ``completed``."""

from __future__ import annotations

from collections import Counter

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("transformers")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus import Deadline, MLflowLogger, TrainerPlus  # noqa: E402
from tests.callbacks.deadline_helpers import ARGS as SCHEDULE  # noqa: E402
from tests.callbacks.deadline_helpers import TIMING, SignalAt  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]

ARGS = {**SCHEDULE, "disable_tqdm": True}


def histories(client: MlflowClient, experiment: str):
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    points = Counter()
    values = {}
    for key in run.data.metrics:
        if any(part in key for part in TIMING):
            continue
        for metric in client.get_metric_history(run.info.run_id, key):
            points[(key, metric.step)] += 1
            values[(key, metric.step)] = metric.value
    return run, points, values


def train(out, uri, experiment, callbacks, resume=False):
    logger = MLflowLogger(tracking_uri=uri, experiment_name=experiment)
    trainer = make_trainer(out, callbacks=[*callbacks, logger], trainer_class=TrainerPlus, **ARGS)
    trainer.train(resume_from_checkpoint=True if resume else None)
    return logger


def test_a_stopped_and_resumed_run_is_one_mlflow_run_equal_to_an_uninterrupted_one(tmp_path, sqlite_uri):
    client = MlflowClient(sqlite_uri)
    train(tmp_path / "run", sqlite_uri, "stopped", [Deadline(margin=0), SignalAt(7, "step")])
    run, points, _ = histories(client, "stopped")
    assert run.info.status == "FINISHED" and run.data.tags["deadline/reason"] == "SIGUSR1"
    assert max(step for _, step in points) == 6  # logged at steps 3 and 6; steps 7-9 are logged at 9
    first_id = run.info.run_id

    train(tmp_path / "run", sqlite_uri, "stopped", [Deadline(margin=0)], resume=True)
    train(tmp_path / "reference", sqlite_uri, "reference", [Deadline(margin=0)])
    run, points, values = histories(client, "stopped")
    reference, ref_points, ref_values = histories(client, "reference")
    assert run.info.run_id == first_id and run.info.status == "FINISHED"
    assert run.data.tags["deadline/reason"] == "completed" == reference.data.tags["deadline/reason"]
    assert set(points.values()) == {1}, [point for point, count in points.items() if count > 1]
    assert points == ref_points and values == ref_values  # the loss at step 9 too: the window travelled


@pytest.mark.second_tier
def test_wandb_offline_each_session_finishes_with_exit_code_0_and_the_reason_in_the_summary(
    tmp_path, monkeypatch
):
    """W&B (offline files read back): the stopped session finishes its run with exit code 0 (W&B shows it
    "finished"; only a process killed before its end shows "crashed"), the resumed session continues the
    same run id; the summary's ``deadline/reason`` tells the sessions apart."""
    pytest.importorskip("wandb")
    from tests.loggers.wandb_helpers import fast_logger, offline_env, runs, steps_per_key

    root = offline_env(monkeypatch, tmp_path / "wandb")
    out = tmp_path / "run"
    first = make_trainer(
        out,
        callbacks=[Deadline(margin=0), SignalAt(7, "step"), fast_logger(project="deadline")],
        trainer_class=TrainerPlus,
        **ARGS,
    )
    first.train()
    logger = fast_logger(project="deadline")
    make_trainer(out, callbacks=[Deadline(margin=0), logger], trainer_class=TrainerPlus, **ARGS).train(
        resume_from_checkpoint=True
    )
    stopped, resumed = runs(root)
    assert stopped.run_id == resumed.run_id == logger.run_id
    assert (stopped.exit_code, resumed.exit_code) == (0, 0)
    assert (
        stopped.summary["deadline/reason"] == "SIGUSR1" and resumed.summary["deadline/reason"] == "completed"
    )
    per_key = steps_per_key([stopped, resumed])
    assert per_key["train/loss"] == [3, 6, 9, 12, 15] and per_key["eval/loss"] == [4, 8, 12, 16]
