"""LightweightTrainer on a LoRA model: checkpoints hold the adapter (as transformers.Trainer
saves it), resume loads it back, and EarlyStopping(restore_best=True) restores the best one."""

from __future__ import annotations

import pytest
import torch

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments
from tests.trl_peft import tiny_lm

pytestmark = [pytest.mark.transformers]

SCORES = {2: 5.0, 4: 3.0, 6: 4.0, 8: 4.5}  # best at step 4; patience 2 stops at step 8


def lora_trainer(output_dir, callbacks=(), **args):
    from peft import get_peft_model

    model = get_peft_model(tiny_lm.causal_lm(), tiny_lm.lora_config())
    tokenizer = tiny_lm.tokenizer()
    encoded = tokenizer(list(tiny_lm.texts()[:32]), padding="max_length", truncation=True, max_length=16,
                        return_tensors="pt")
    batches = [{key: encoded[key][i:i + 4] for key in ("input_ids", "attention_mask")}
               for i in range(0, 32, 4)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    holder = {}

    def train_step(batch):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        return float(loss.detach())

    values = {"output_dir": str(output_dir), "max_steps": 8, "eval_strategy": "steps", "eval_steps": 2,
              "logging_steps": 2, "save_strategy": "steps", "save_steps": 2, "seed": 0}
    values.update(args)
    trainer = LightweightTrainer(
        LoopArguments(**values), train_step=train_step, train_data=batches, model=model, optimizer=optimizer,
        eval_fn=lambda _: {"score": SCORES.get(holder["trainer"].state.global_step, 9.0)},
        callbacks=list(callbacks))
    holder["trainer"] = trainer
    return trainer


def adapter(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def test_checkpoints_hold_the_adapter_and_restore_best_loads_it(tmp_path):
    stopper = EarlyStopping("eval_score", mode="min", patience=2, restore_best=True)
    trainer = lora_trainer(tmp_path, [stopper])
    seen = {}

    class Remember(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen[state.global_step] = adapter(trainer.model)

    trainer.add_callback(Remember())
    trainer.train()
    checkpoint = tmp_path / "checkpoint-4"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model_state.pkl").exists()
    assert stopper.best_checkpoint.endswith("checkpoint-4") and stopper._best_weights.snapshot is None
    final = adapter(trainer.model)
    assert all(torch.equal(final[name], seen[4][name]) for name in final)
    assert any(not torch.equal(final[name], seen[8][name]) for name in final)


def test_resume_loads_the_adapter_of_the_checkpoint(tmp_path):
    lora_trainer(tmp_path, max_steps=4).train()
    fresh = adapter(lora_trainer(tmp_path / "unused").model)  # an untrained model: differs from step 4
    at_begin = {}

    class AtTrainBegin(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            at_begin.update(adapter(model))

    resumed = lora_trainer(tmp_path, [AtTrainBegin()], max_steps=6)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    from safetensors.torch import load_file

    on_disk = load_file(str(tmp_path / "checkpoint-4" / "adapter_model.safetensors"))
    assert len(on_disk) == len(at_begin)
    assert any(not torch.equal(at_begin[name], fresh[name]) for name in at_begin)
    for key, value in on_disk.items():
        assert torch.equal(at_begin[key.replace(".weight", ".default.weight")], value), key
