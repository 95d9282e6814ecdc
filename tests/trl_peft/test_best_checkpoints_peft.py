"""KeepBestCheckpoints with trl's SFTTrainer on a LoRA model: the kept folders hold the adapter
only (as the trainer saved it), with the adapter weights of their step; the best step is the one
load_best_model_at_end and EarlyStopping(restore_best=True) pick, across a crash and resume."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from tests.callbacks.best_checkpoints_helpers import ScriptedMetrics
from tests.trl_peft import runs
from tests.trl_peft.test_restore_best_peft import FaultInjectingCrash

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

SCORES = {2: 5.0, 4: 3.0, 6: 4.0, 8: 3.5}
KEPT_STEPS = [4, 8]  # the two lowest


class AdapterAtSave(TrainerCallback):
    """The LoRA weights at every save, as peft names them in ``adapter_model.safetensors``."""

    def __init__(self):
        self.weights = {}

    def on_save(self, args, state, control, model=None, **kwargs):
        from peft import get_peft_model_state_dict

        self.weights[state.global_step] = {name: tensor.detach().clone()
                                           for name, tensor in get_peft_model_state_dict(model).items()}


def build(output_dir, callbacks, **overrides):
    score = ScriptedMetrics(score=SCORES)
    args = dict(max_steps=8, eval_strategy="steps", eval_steps=2, logging_steps=2, save_strategy="steps",
                save_steps=2, save_total_limit=1, with_subset_eval=False, peft=True,
                metric_for_best_model="score", greater_is_better=False, load_best_model_at_end=True)
    trainer = runs.trainer("sft", output_dir, callbacks=callbacks, compute_metrics=score,
                           **{**args, **overrides})
    score.trainer = trainer
    return trainer


def assert_adapters_kept(output_dir, recorded):
    for step in KEPT_STEPS:
        folder = output_dir / "best_checkpoints" / f"checkpoint-{step}"
        names = set(os.listdir(folder))
        assert {"adapter_model.safetensors", "adapter_config.json"} <= names
        assert not names & {"model.safetensors", "pytorch_model.bin", "optimizer.pt", "scheduler.pt"}
        saved = load_file(str(folder / "adapter_model.safetensors"))
        assert saved.keys() == recorded[step].keys() and saved
        assert all(torch.equal(saved[name], recorded[step][name]) for name in saved), step


def test_sft_lora_keeps_adapters_across_a_crash_and_agrees_on_the_best(tmp_path):
    def stopper():
        return EarlyStopping("eval_score", mode="min", patience=100, restore_best=True)

    recorder = AdapterAtSave()
    with pytest.raises(RuntimeError, match="injected crash"):
        build(tmp_path, [recorder, KeepBestCheckpoints(k=2), stopper(), FaultInjectingCrash(5)]).train()
    keeper, stopping = KeepBestCheckpoints(k=2), stopper()  # k=2 by metric_for_best_model
    trainer = build(tmp_path, [recorder, keeper, stopping])
    trainer.train(resume_from_checkpoint=True)
    assert [entry.step for entry in keeper.ranking["eval_score"]] == [4, 8]
    assert trainer.state.best_global_step == stopping.best_step == 4
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*")) == [4]
    assert_adapters_kept(tmp_path, recorder.weights)
    # only the adapter was kept: much smaller than the model
    kept = os.path.getsize(tmp_path / "best_checkpoints" / "checkpoint-4" / "adapter_model.safetensors")
    assert kept * 10 < sum(p.numel() * p.element_size() for p in trainer.model.parameters())
