"""``WandbLogger`` with a stock ``transformers.Trainer``: real W&B offline runs, read back from disk."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from hf_callbacks_plus.metrics.keys import KeyGrammar
from tests.loggers.wandb_helpers import fast_logger, offline_env, runs

pytest.importorskip("wandb")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.wandb, pytest.mark.transformers]

SECRETS = ("hf_abcdefghijklmnopqrstuvwxyz0123", "sekrit-password-1", "my-api-key-value", "tok-0042-secret")


class FakeModelConfig(dict):
    """A model config (dict) holding secrets next to ordinary fields, like some user configs do."""


def _model_with_secret_config(trainer) -> None:
    trainer.model.config = FakeModelConfig(hidden_size=4, db_password=SECRETS[1], wandb_api_key=SECRETS[2],
                                           auth={"access_token": SECRETS[3]}, pad_token_id=0)


class LogExtrasCallback(transformers.TrainerCallback):
    """Logs a test metric, a custom-prefix metric, a pre-rendered custom key and a text mid-training."""

    def __init__(self, trainer_box: list) -> None:
        self.trainer_box = trainer_box

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 5:
            self.trainer_box[0].log({"test_f1": 0.5, "val_acc": 0.75, "custom/score": 3.0, "note": "hello"})


def test_sections_summary_config_and_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tiny_models import RegressionDataset, make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    wandb_logger = fast_logger(project="sections", tags=["t1"], grammar=KeyGrammar(prefixes=["val"]))
    box: list = []
    trainer = make_trainer(tmp_path / "out", callbacks=[wandb_logger, LogExtrasCallback(box)],
                           logging_steps=2, eval_strategy="steps", eval_steps=4, max_steps=8,
                           hub_token=SECRETS[0])
    box.append(trainer)
    trainer.eval_dataset = {"alpha": RegressionDataset(8, seed=3), "beta": RegressionDataset(8, seed=4)}
    wandb_logger.attach_trainer(trainer)
    _model_with_secret_config(trainer)
    trainer.train()

    (run,) = runs(root)
    assert run.project == "sections" and run.tags == ["t1"] and run.exit_code == 0
    assert run.run_id == wandb_logger.run_id
    assert run.steps("train/loss") == [2, 4, 6, 8]
    assert run.steps("eval/alpha/loss") == [4, 8] and run.steps("eval/beta/mse") == [4, 8]
    assert run.steps("test/f1") == [5] and run.steps("val/acc") == [5] and run.steps("custom/score") == [5]
    assert all(row["train/global_step"] == row["_step"] for row in run.history)
    keys = run.keys()
    assert not [key for key in keys if key.startswith("eval_") or key.startswith("train/train_")], keys
    assert not keys & {"train_runtime", "train/train_runtime", "total_flos", "train_summary/runtime"}
    # end-of-training totals and text values: summary, not curves
    assert run.summary["train_summary/runtime"] > 0 and "train_summary/samples_per_second" in run.summary
    assert run.summary["train/note"] == "hello"
    # one step axis for every section
    assert any(m.get("glob_name") == "*" and m.get("step_metric") == "train/global_step" for m in run.metrics)
    # config: flattened once, typed, redacted; the secrets reach no record at all
    assert run.config["learning_rate"] == 0.1 and run.config["max_steps"] == 8
    assert run.config["model.hidden_size"] == 4 and run.config["model.pad_token_id"] == 0
    for key in ("hub_token", "model.db_password", "model.wandb_api_key", "model.auth.access_token"):
        assert run.config[key] == "<redacted>", key
    raw = run.path.read_bytes()
    for secret in SECRETS:
        assert secret.encode() not in raw


def test_disabled_is_a_no_op_with_its_own_message(tmp_path: Path, monkeypatch, caplog) -> None:
    from hf_callbacks_plus.loggers.wandb import WandbLogger
    from tests.tiny_models import make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        by_env = WandbLogger()
    assert by_env.disabled and "WANDB_DISABLED='true' is set" in caplog.text
    assert "not installed" not in caplog.text
    monkeypatch.delenv("WANDB_DISABLED")
    by_mode = WandbLogger(mode="disabled")
    assert by_mode.disabled and "mode='disabled'" in by_mode.disabled_reason
    make_trainer(tmp_path / "out", callbacks=[by_env, by_mode], max_steps=2, logging_steps=1).train()
    assert by_env.run_id is None and by_mode.run_id is None and by_mode.run is None
    assert not (root / "wandb").exists()


def test_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_callbacks_plus.loggers.wandb import WandbLogger

    for name in ("WANDB_DISABLED", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    # FakeMissingWandb: ``None`` in sys.modules makes ``import wandb`` fail as if not installed.
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'hf-callbacks-plus\[wandb\]'") as info:
        WandbLogger()
    assert "disabled" not in str(info.value)
    monkeypatch.setenv("WANDB_DISABLED", "1")  # disabled needs no wandb at all
    assert WandbLogger().disabled


def test_bad_arguments_name_value_and_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_callbacks_plus.loggers.wandb import WandbLogger

    monkeypatch.delenv("WANDB_DISABLED", raising=False)
    monkeypatch.setenv("WANDB_LOG_MODEL", "sometimes")
    with pytest.raises(ValueError, match=r"WANDB_LOG_MODEL='sometimes'.*'end', 'checkpoint'"):
        WandbLogger()
    monkeypatch.delenv("WANDB_LOG_MODEL")
    with pytest.raises(ValueError, match=r"resume='maybe'"):
        WandbLogger(resume="maybe")
    with pytest.raises(ValueError, match=r"mode='cloud'"):
        WandbLogger(mode="cloud")
    with pytest.raises(TypeError, match="tags"):
        WandbLogger(tags="one-string")
    monkeypatch.setenv("WANDB_LOG_MODEL", "true")  # transformers' legacy spelling
    assert WandbLogger().log_model == "end"


def test_only_rank_zero_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tiny_models import make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setenv("RANK", "1")
    wandb_logger = fast_logger()
    make_trainer(tmp_path / "out", callbacks=[wandb_logger], max_steps=2, logging_steps=1).train()
    assert wandb_logger.run_id is None and not (root / "wandb").exists()


def test_env_project_run_id_and_checkpoint_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tiny_models import make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.setenv("WANDB_RUN_ID", "envrun01")
    monkeypatch.setenv("WANDB_LOG_MODEL", "checkpoint")
    wandb_logger = fast_logger()
    make_trainer(tmp_path / "out", callbacks=[wandb_logger], max_steps=4, logging_steps=2,
                 save_strategy="steps", save_steps=2).train()
    (run,) = runs(root)
    assert (run.run_id, run.project) == ("envrun01", "from-env")
    assert run.record_counts.get("artifact", 0) == 2  # checkpoint-2 and checkpoint-4


def test_log_model_end_and_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tiny_models import make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setenv("WANDB_WATCH", "gradients")
    wandb_logger = fast_logger(log_model="end")
    assert wandb_logger.watch == "gradients"
    make_trainer(tmp_path / "out", callbacks=[wandb_logger], max_steps=2, logging_steps=1).train()
    (run,) = runs(root)
    assert run.record_counts.get("artifact", 0) == 1 and run.exit_code == 0
    assert run.steps("train/loss") == [1, 2]


def test_explicit_run_id_continues_the_given_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tiny_models import make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    first = fast_logger(project="given", run_id="given001")
    make_trainer(tmp_path / "a", callbacks=[first], max_steps=4, logging_steps=2).train()
    second = fast_logger(project="given", run_id="given001")
    make_trainer(tmp_path / "b", callbacks=[second], max_steps=6, logging_steps=2).train()
    earlier, continued = runs(root)
    assert earlier.run_id == continued.run_id == first.run_id == second.run_id == "given001"
    # a new training into the given offline run: W&B's run files are not read back, so it logs its
    # own steps (online, W&B's starting step of the resumed run makes it skip the steps it holds)
    assert earlier.steps("train/loss") == [2, 4] and continued.steps("train/loss") == [2, 4, 6]
    assert continued.exit_code == 0
