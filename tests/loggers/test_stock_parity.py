"""Parity with the stock loggers where users rely on it: the parameter count and the peft
config in the run config (the stock ``WandbCallback`` logs both)."""

from __future__ import annotations

import pytest
from torch import nn

from hf_callbacks_plus.loggers.config import collect_config
from tests.tiny_models import make_trainer, training_args

pytestmark = pytest.mark.transformers


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.proj(x))


def test_config_holds_the_parameter_count_and_the_peft_config(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(TwoLayers(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["proj"]))
    params = collect_config(training_args(tmp_path), model)
    assert params["model/num_parameters"] == str(sum(p.numel() for p in model.parameters()))
    assert params["peft_config.default.r"] == "2" and params["peft_config.default.lora_alpha"] == "4"
    assert "proj" in params["peft_config.default.target_modules"]


def test_plain_model_has_a_count_and_no_peft_keys(tmp_path):
    params = collect_config(training_args(tmp_path), TwoLayers())
    assert params["model/num_parameters"] == str(4 * 8 + 8 + 8 + 1)
    assert not [key for key in params if key.startswith("peft_config")]


@pytest.mark.wandb
def test_wandb_config_has_model_num_parameters(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.loggers.wandb_helpers import fast_logger, offline_env, runs

    root = offline_env(monkeypatch, tmp_path / "wandb")
    logger = fast_logger(project="parity", dir=str(root))
    make_trainer(tmp_path / "out", callbacks=[logger], max_steps=2, logging_steps=1).train()
    (run,) = runs(root)
    assert run.config["model/num_parameters"] == 2  # TinyRegressionModel: a and b


@pytest.mark.trackio
def test_trackio_config_holds_the_training_arguments_like_the_stock_callback(tmp_path):
    """Ours and the stock ``TrackioCallback`` side by side: the same training arguments in the run
    config (ours flattened and typed), and ours the parameter count (the stock one counts only a
    ``PreTrainedModel``'s)."""
    pytest.importorskip("trackio")
    from hf_callbacks_plus.loggers.trackio import TrackioLogger
    from tests.loggers.trackio_helpers import project_name, trackio_runs

    project = project_name(tmp_path)
    make_trainer(tmp_path / "stock", max_steps=2, logging_steps=1, report_to="trackio",
                 project=project + "-stock").train()
    logger = TrackioLogger(project=project)
    make_trainer(tmp_path / "ours", callbacks=[logger], max_steps=2, logging_steps=1).train()
    ((stock,), (ours,)) = trackio_runs(project + "-stock"), trackio_runs(project)
    for key in ("learning_rate", "max_steps", "seed", "per_device_train_batch_size", "logging_steps"):
        assert ours.config[key] == stock.config[key], key
    assert ours.config["model/num_parameters"] == 2
