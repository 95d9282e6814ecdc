"""``hf-callbacks-plus replay`` into a W&B offline run: the run is reopened (same id), gets the
spilled steps once and its exit code. ``FaultInjectingBackend`` makes every ``run.log`` of the
training fail (W&B offline cannot be made unreachable for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_callbacks_plus.cli import main as cli
from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loop.arguments import LoopArguments
from hf_callbacks_plus.loop.trainer import LightweightTrainer
from tests.loggers.faults import FaultInjectingBackend
from tests.loggers.wandb_helpers import fast_logger, offline_env, runs, steps_per_key

pytest.importorskip("wandb")

pytestmark = pytest.mark.wandb


def test_replay_reopens_the_wandb_run_and_sends_each_step_once(tmp_path: Path, monkeypatch) -> None:
    root = offline_env(monkeypatch, tmp_path / "wb")
    logger = fast_logger(project="replayed", flush_timeout=1.0, backoff=(0.01, 0.05), log_config=False)
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log",))

    class WaitForTheRun(TrainerCallback):
        """Listed before the logger: the W&B run is open before the logger closes (W&B takes seconds
        to open an offline run on a busy machine; the close deadline is 1 s)."""

        def on_train_end(self, args, state, control, **kwargs):
            assert logger.worker.wait_started(120)

    args = LoopArguments(output_dir=str(tmp_path / "out"), max_steps=4, logging_steps=1, disable_tqdm=True)
    LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=[[1.0]] * 4,
                       callbacks=[WaitForTheRun(), logger], learning_rate_fn=lambda: 0.1).train()
    spill = logger.spill_path
    assert [json.loads(line)["step"] for line in spill.read_text().splitlines()
            if "train/loss" in json.loads(line).get("metrics", {})] == [1, 2, 3, 4]
    (first,) = runs(root)
    assert first.steps("train/loss") == [] and first.exit_code == 0

    assert cli(["replay", str(spill.parent)]) == 0
    assert not spill.exists()
    assert cli(["replay", str(spill.parent)]) == 0  # nothing left: nothing sent twice
    earlier, replayed = runs(root)
    assert replayed.run_id == first.run_id == logger.run_id
    assert replayed.steps("train/loss") == [1, 2, 3, 4] and replayed.exit_code == 0
    assert steps_per_key([earlier, replayed])["train/loss"] == [1, 2, 3, 4]
