"""Run by tests/callbacks/test_throughput_sharded.py in a subprocess of its own (a process group of
one gloo rank stays up until the process ends): ThroughputMonitor's FLOP count under each sharding
engine at world size 1, where each engine already replaces the weights it shards (FSDP2:
DTensors; FSDP1: flat parameters, or 1-D views of them with ``use_orig_params=True``; DeepSpeed
ZeRO-3: placeholders of shape ``[0]``), and a stock ``Trainer`` under ZeRO-3 with and without the
monitor.

``python -m tests.callbacks.throughput_sharded <out.json> counts|zero3-trainer``
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

ZERO3 = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
         "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
         "train_batch_size": "auto"}


def one_rank_group() -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", "29631")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def variant(name: str) -> Any:
    """The tiny Llama of tests/callbacks/test_flops.py: ``full`` fine-tuning, a ``tied`` head, or
    ``frozen`` embeddings and first layer (trained and frozen weights apart)."""
    from tests.callbacks.test_flops import llama

    model = llama(tie_word_embeddings=True, num_key_value_heads=2) if name == "tied" else llama()
    if name == "frozen":
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.startswith(("model.embed_tokens", "model.layers.0.")):
                parameter.requires_grad_(False)
    return model


def shard(engine: str, model_name: str) -> Any:
    if engine == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model, mesh = variant(model_name), init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if engine.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(variant(model_name), device_id=torch.device("cpu"),
                                        use_orig_params=engine == "fsdp1-orig-params",
                                        sync_module_states=False)
    import deepspeed

    with deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3},
                                                  "train_micro_batch_size_per_gpu": 1}):
        return variant(model_name)


def counts() -> dict[str, Any]:
    """Per engine and model: the FLOP count, the engine named, what ``measure`` answers at train
    begin; per model: the unsharded count and ``torch.utils.flop_counter``'s."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
    from hf_callbacks_plus.callbacks.throughput.flops import measure_training_flops, training_flops
    from hf_callbacks_plus.runtime.engines import sharding_engine
    from tests.callbacks.test_flops import batch

    args = TrainingArguments("unused", use_cpu=True, report_to="none")
    result: dict[str, Any] = {"unsharded": {}, "flop_counter": {}, "sharded": {}}
    for model_name in ("full", "tied", "frozen"):
        reference = variant(model_name)
        result["unsharded"][model_name] = training_flops(reference).__dict__
        result["flop_counter"][model_name] = measure_training_flops(reference, batch())
        for engine in ("fsdp2", "fsdp1", "fsdp1-orig-params", "zero3"):
            if engine == "fsdp1" and model_name == "frozen":
                continue  # FSDP1 without use_orig_params needs one requires_grad per flat parameter
            model = shard(engine, model_name)
            monitor = ThroughputMonitor(flops_per_token="measure")
            try:
                monitor.on_train_begin(args, TrainerState(), TrainerControl(), model=model)
                refusal = None
            except ValueError as error:
                refusal = str(error)
            monitor.on_train_end(args, TrainerState(), TrainerControl())
            local = {tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
                     for p in model.parameters()}
            result["sharded"][f"{engine}/{model_name}"] = {
                "engine": sharding_engine(model), "flops": training_flops(model).__dict__, "refusal": refusal,
                "local_shapes": sorted(local)[:3],
            }
    return result


def zero3_trainer() -> dict[str, Any]:
    """A stock Trainer under ZeRO-3: without the monitor, with ``flops_per_token="auto"`` and with
    ``"measure"``, and under ZeRO-2 without it and with ``"auto"``; each run's log history and the monitor's
    count, and the unsharded model's count and ``flop_counter`` measurement of the first batch."""
    from transformers import Trainer

    from hf_callbacks_plus import run_before_integrations
    from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
    from hf_callbacks_plus.callbacks.throughput.flops import measure_training_flops, training_flops
    from tests.callbacks.throughput_helpers import RecordingCollator, lm_rows, tiny_llama
    from tests.tiny_models import training_args

    result: dict[str, Any] = {}
    for run in ("none", "auto", "measure", "zero2-none", "zero2-auto"):
        collator = RecordingCollator()
        mode = run.removeprefix("zero2-")
        monitor = ThroughputMonitor(flops_per_token=mode, peak_flops=1e12) if mode != "none" else None
        config = {**ZERO3, "zero_optimization": {"stage": 2}} if run.startswith("zero2") else ZERO3
        trainer = Trainer(model=tiny_llama(attention_dropout=0.3), train_dataset=lm_rows(24, seed=1),
                          args=training_args(f"out-{run}", max_steps=4, logging_steps=2, learning_rate=0.01,
                                             per_device_train_batch_size=4, remove_unused_columns=False,
                                             deepspeed=config),
                          data_collator=collator, callbacks=[monitor] if monitor else [])
        run_before_integrations(trainer)
        trainer.train()
        result[run] = {"history": trainer.state.log_history,
                       "flops": monitor.flops.__dict__ if monitor and monitor.flops else None,
                       "placeholder": list(next(trainer.model.parameters()).shape)}
        if run == "measure":
            first = collator.batches[0]
            reference = tiny_llama(attention_dropout=0.3).train()
            result["unsharded"] = training_flops(reference).__dict__
            result["measured_by_hand"] = measure_training_flops(reference, first) / first["input_ids"].numel()
    return result


def main() -> None:
    out, what = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    one_rank_group()
    result = counts() if what == "counts" else zero3_trainer()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, default=str)


if __name__ == "__main__":
    main()
