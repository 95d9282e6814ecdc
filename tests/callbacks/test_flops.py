"""The FLOP count from weights and config, against ``torch.utils.flop_counter`` on the same models
(eager attention, whose matrix products the counter sees), full fine-tuning and LoRA; the peak
table's device names; the precision and the label-shift rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_callbacks_plus.callbacks.throughput.flops import (
    chip_of,
    loss_shifts_labels,
    measure_training_flops,
    peak_flops,
    training_flops,
    training_precision,
)

pytestmark = pytest.mark.transformers

B, S = 3, 10


def llama(attention: str = "eager", **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    values = {"vocab_size": 48, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32}
    values.update(overrides)
    config = LlamaConfig(**values)
    config._attn_implementation = attention
    return LlamaForCausalLM(config).train()


def gpt2(attention: str = "eager"):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=48, n_positions=32, n_embd=16, n_layer=3, n_head=4)
    config._attn_implementation = attention
    return GPT2LMHeadModel(config).train()


def batch(padded: bool = False) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 40, (B, S), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(B, S, dtype=torch.long)
    if padded:
        mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


MODELS = {
    "llama-gqa": lambda: llama(),
    "llama-tied-head": lambda: llama(tie_word_embeddings=True, num_key_value_heads=2),
    "llama-head-dim": lambda: llama(head_dim=4, num_attention_heads=4, num_key_value_heads=2),
    "gpt2-conv1d": gpt2,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_full_fine_tuning_count_equals_the_flop_counter(name):
    model = MODELS[name]()
    counted = training_flops(model)
    assert counted.trained_parameters == counted.parameters
    # every position computed (the padded ones too): the counter counts what the kernels do
    assert counted.flops(B * S, B * S * S) == measure_training_flops(model, batch())
    assert counted.flops(B * S, B * S * S) == measure_training_flops(model, batch(padded=True))


def test_tied_head_is_counted_once_as_the_product_it_is():
    tied, untied = training_flops(llama(tie_word_embeddings=True)), training_flops(llama())
    assert tied.parameters == untied.parameters  # the head's product runs either way
    assert tied.parameters == sum(p.numel() for n, p in llama().named_parameters()
                                  if p.dim() == 2 and "embed_tokens" not in n)


def test_frozen_weights_cost_four_flops_per_parameter_trained_ones_six():
    model = llama()
    everything = training_flops(model)
    for parameter in model.model.layers[1].parameters():
        parameter.requires_grad_(False)
    frozen = sum(p.numel() for p in model.model.layers[1].parameters() if p.dim() == 2)
    counted = training_flops(model)
    assert counted.parameters == everything.parameters
    assert counted.trained_parameters == everything.parameters - frozen
    assert counted.per_token == 6 * everything.parameters - 2 * frozen
    # layer 1 is above trained weights: every activation gradient still flows, the counter agrees
    assert counted.flops(B * S, B * S * S) == measure_training_flops(model, batch())


def test_lora_count_against_the_flop_counter():
    """With LoRA the count is high by exactly what autograd skips below the first trained weight:
    the input gradients of the first layer's products that read the (frozen) embeddings, and the
    gradient of the first layer's keys (a frozen projection of a frozen input)."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    base = llama()
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0, task_type="CAUSAL_LM")).train()
    counted = training_flops(model)
    trainable, _ = model.get_nb_trainable_parameters()
    assert counted.trained_parameters == trainable
    assert counted.parameters == training_flops(llama()).parameters + trainable
    measured = measure_training_flops(model, batch())
    first = model.base_model.model.model.layers[0].self_attn
    reads_embeddings = sum(p.numel() for module in (first.q_proj, first.k_proj, first.v_proj)
                           for n, p in module.named_parameters() if "lora_B" not in n)
    key_gradient = 2 * B * 2 * S * S * 8  # one (S x S)(S x head_dim) product per head
    assert counted.flops(B * S, B * S * S) - measured == 2 * reads_embeddings * B * S + key_gradient


def test_measurement_counts_pytorchs_cpu_attention_kernel():
    """``flop_counter`` knows the CUDA attention kernels only: without our formulas it misses the
    CPU kernel Llama uses; with them it counts it, with the backward's recomputation of the
    scores (one more S x S product per layer and head than the eager products)."""
    from torch.utils.flop_counter import FlopCounterMode

    eager = measure_training_flops(llama("eager"), batch())
    fused = measure_training_flops(llama("sdpa"), batch())
    layers, width = 2, 16  # 2 heads x head_dim 8
    attention = 12 * layers * width * B * S * S
    assert fused - eager == layers * 2 * B * S * S * width
    model = llama("sdpa")
    with FlopCounterMode(display=False) as plain:
        model(**batch()).loss.backward()
    assert plain.get_total_flops() == eager - attention


def test_measurement_leaves_gradients_and_random_state_alone():
    model = llama(attention_dropout=0.5)
    before = torch.random.get_rng_state()
    measure_training_flops(model, batch())
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())


def test_a_model_without_attention_config_counts_its_products_only():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    counted = training_flops(model)
    assert (counted.parameters, counted.per_squared_length) == (4 * 8 + 8 * 2, 0.0)


@pytest.mark.parametrize(
    ("name", "chip"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", None),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", None),
        ("Tesla V100-SXM2-16GB", "v100-sxm"),
        ("Tesla V100-PCIE-32GB", "v100-pcie"),
        ("Tesla T4", "t4"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_device_names_map_to_chips(name, chip):
    assert chip_of(name) == chip


def test_peak_is_dense_and_absent_precisions_are_none():
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12  # the datasheet's 624 is with sparsity
    assert peak_flops("Tesla T4", "bf16") is None
    assert peak_flops("Some New GPU", "bf16") is None
    with pytest.raises(ValueError, match=r"one of \['fp32', 'tf32', 'bf16', 'fp16'\], got 'fp8'"):
        peak_flops("NVIDIA A100-SXM4-80GB", "fp8")


def test_precision_of_a_run():
    model = llama()
    assert training_precision(SimpleNamespace(bf16=True, fp16=False), model) == "bf16"
    assert training_precision(SimpleNamespace(bf16=False, fp16=True), model) == "fp16"
    assert training_precision(SimpleNamespace(bf16=False, fp16=False), model.to(torch.bfloat16)) == "bf16"
    expected = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    assert training_precision(SimpleNamespace(bf16=False, fp16=False, tf32=None), llama()) == expected


def test_which_losses_shift_their_labels():
    from transformers import LlamaConfig, LlamaForSequenceClassification, T5Config, T5ForConditionalGeneration

    assert loss_shifts_labels(llama()) and loss_shifts_labels(gpt2())
    config = LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, pad_token_id=0)
    assert not loss_shifts_labels(LlamaForSequenceClassification(config))
    assert not loss_shifts_labels(T5ForConditionalGeneration(T5Config(vocab_size=48, d_model=16, d_ff=32,
                                                                      num_layers=1, num_heads=2, d_kv=8)))
    assert not loss_shifts_labels(torch.nn.Linear(2, 2))


def test_measure_is_refused_with_reentrant_checkpointing():
    """With reentrant activation checkpointing (trl sets it for PEFT under ZeRO-3) the extra pass's
    ``autograd.grad`` cannot follow the checkpointed layers' backward: torch refuses it (a crash of
    the training, before) or, when the inputs require gradients (PEFT's
    ``enable_input_require_grads``), it counts far fewer FLOPs than the same model with
    non-reentrant checkpointing (which recomputes the forward: more than without). The monitor
    refuses ``measure`` there at train begin, naming the way out."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor

    counts = {}
    cases = (("none", None), ("non-reentrant", {"use_reentrant": False}),
             ("reentrant", {"use_reentrant": True}), ("reentrant-input-grads", {"use_reentrant": True}))
    for name, kwargs in cases:
        model = llama()
        if kwargs is not None:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if name == "reentrant-input-grads":
            model.enable_input_require_grads()
        try:
            counts[name] = measure_training_flops(model, batch())
        except RuntimeError as error:
            counts[name] = str(error)
    assert counts["non-reentrant"] > counts["none"]
    for name in ("reentrant", "reentrant-input-grads"):  # refused by torch, or far too few
        wrong = counts[name]
        refused = isinstance(wrong, str) and "incompatible with .grad()" in wrong
        assert refused or wrong < counts["none"], name
    args = TrainingArguments("unused", use_cpu=True, report_to="none")
    monitor = ThroughputMonitor(flops_per_token="measure")
    with pytest.raises(ValueError, match="reentrant activation checkpointing.*use_reentrant=False"):
        monitor.on_train_begin(args, TrainerState(), TrainerControl(), model=model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    monitor.on_train_begin(args, TrainerState(), TrainerControl(), model=model)  # accepted
    monitor.on_train_end(args, TrainerState(), TrainerControl())
