"""Training FLOPs of a model, and the peak FLOP/s of known accelerators.

**The count.** One training token costs, in every weight matrix of ``P`` parameters, ``2P``
FLOPs forward, ``2P`` backward to the layer's input, and ``2P`` backward to the weight itself,
the last only when the weight is trained. So a model whose matrices hold ``P`` parameters of
which ``P_t`` are trained costs ``4P + 2P_t`` per token (``6P`` in full fine-tuning; with LoRA
the frozen weights cost ``4P`` and the adapters ``6P_adapter``). Attention adds, per token and
per layer, ``4·d_attn·S`` forward (``QKᵀ`` and ``AV`` over a context of ``S`` positions) and
twice that backward: ``12·L·d_attn·S`` (the PaLM convention: the whole ``S x S`` product, causal
mask or not). Summed over a sequence of ``S`` tokens that is ``12·L·d_attn·S²``, so a batch costs
``(4P + 2P_t)·tokens + 12·L·d_attn·Σ S²``.

``P`` counts the weights of the matrix products the model runs: every parameter with two or more
dimensions except embedding tables (a lookup, no product), and a language-model head tied to its
embedding counted once, as the product it is. Biases and norms are left out. The shapes are the
full ones whatever engine shards the weights (`full_weights`): DeepSpeed ZeRO-3's ``ds_shape``
(its parameters are placeholders of shape ``[0]``), FSDP1's original shapes (``FlatParameter``
metadata: the modules hold 1-D flat shards, or views of them), a DTensor's global shape (FSDP2),
so every rank counts the whole model. ``L`` and
``d_attn = heads x head_dim`` come from the model's config. The count assumes activation
gradients flow through every layer; autograd skips those below the first trained weight (with
LoRA, the frozen projections of the first layer), so the count is a little high there.
`measure_training_flops` counts one real step with ``torch.utils.flop_counter`` instead.

**The peak.** `peak_flops` gives the dense (no sparsity) peak of one device for a precision
from the vendors' datasheets.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

__all__ = [
    "PEAK_FLOPS",
    "PRECISIONS",
    "TrainingFlops",
    "full_weights",
    "loss_shifts_labels",
    "measure_training_flops",
    "peak_flops",
    "reentrant_checkpointing",
    "training_flops",
    "training_precision",
]

#: The precisions of `PEAK_FLOPS`: matrix products in float32 (no TF32), TF32, bfloat16, float16.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

#: Dense peak FLOP/s of one device, by chip and precision (datasheet figures; the "with
#: sparsity" figures are twice these). A precision a chip lacks is absent.
PEAK_FLOPS: Mapping[str, Mapping[str, float]] = {
    # NVIDIA H100 / H200 datasheets
    "h100-sxm": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "h100-pcie": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "h200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    # NVIDIA A100 (SXM and PCIe alike), A10, L4, L40S datasheets
    "a100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "a10": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},
    "l4": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    "l40s": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362.05e12, "fp16": 362.05e12},
    # NVIDIA V100 and T4 datasheets (no bfloat16, no TF32)
    "v100-sxm": {"fp32": 15.7e12, "fp16": 125e12},
    "v100-pcie": {"fp32": 14e12, "fp16": 112e12},
    "t4": {"fp32": 8.1e12, "fp16": 65e12},
    # AMD Instinct datasheets (matrix cores)
    "mi300x": {"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12},
    "mi250x": {"fp32": 95.7e12, "bf16": 383e12, "fp16": 383e12},
}

#: How a device name (``torch.cuda.get_device_name()``) maps to a chip of `PEAK_FLOPS`:
#: ``(words that must all appear, words that must not, chip)``, first match wins.
_CHIP_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("h100", "pcie"), (), "h100-pcie"),
    (("h100", "hbm3"), ("nvl",), "h100-sxm"),
    (("h100", "sxm"), ("nvl",), "h100-sxm"),
    (("h200",), ("nvl",), "h200"),
    (("a100",), (), "a100"),
    (("a10",), (), "a10"),
    (("l40s",), (), "l40s"),
    (("l4",), (), "l4"),
    (("v100", "sxm2"), (), "v100-sxm"),
    (("v100", "sxm3"), (), "v100-sxm"),
    (("v100", "pcie"), (), "v100-pcie"),
    (("t4",), (), "t4"),
    (("mi300x",), (), "mi300x"),
    (("mi250x",), (), "mi250x"),
)


def chip_of(device_name: str) -> Optional[str]:
    """The `PEAK_FLOPS` chip a device name denotes (``"NVIDIA A100-SXM4-80GB"`` -> ``"a100"``),
    or None for a device the table does not know."""
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for required, excluded, chip in _CHIP_RULES:
        if all(word in words for word in required) and not any(word in words for word in excluded):
            return chip
    return None


def peak_flops(device_name: str, precision: str) -> Optional[float]:
    """The dense peak FLOP/s of one device for ``precision``, or None when the table lacks it.

    Args:
        device_name: What ``torch.cuda.get_device_name()`` returns, e.g. ``"NVIDIA H100 80GB HBM3"``.
        precision: One of `PRECISIONS`.

    Raises:
        ValueError: ``precision`` is not one of `PRECISIONS`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"peak_flops: precision must be one of {list(PRECISIONS)}, got {precision!r}.")
    chip = chip_of(device_name)
    return None if chip is None else PEAK_FLOPS[chip].get(precision)


def training_precision(args: Any, model: Any) -> str:
    """The precision of the matrix products of a run: ``args.bf16``/``args.fp16`` (mixed
    precision), else the dtype of the model's weights, else TF32 when PyTorch allows it for
    float32 products on CUDA, else ``"fp32"``."""
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    import torch

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if getattr(args, "tf32", None) or torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "fp32"


@dataclass(frozen=True)
class TrainingFlops:
    """The FLOPs of training on a batch: ``per_token * tokens + per_squared_length * Σ S²``.

    Attributes:
        per_token: FLOPs per token of the weight products (``4P + 2P_t``), or a measured or
            given figure per token.
        per_squared_length: FLOPs of attention per squared sequence length (``12·L·d_attn``);
            0 when unknown or included in ``per_token``.
        source: ``"config"`` (counted from the weights and the config), ``"measured"``
            (``torch.utils.flop_counter``) or ``"given"`` (a number of yours).
        parameters: ``P``, the parameters of the weight products (0 unless counted).
        trained_parameters: ``P_t``, those of them that are trained (0 unless counted).
    """

    per_token: float
    per_squared_length: float = 0.0
    source: str = "given"
    parameters: int = 0
    trained_parameters: int = 0

    def flops(self, tokens: float, squared_lengths: float) -> float:
        """FLOPs of training on ``tokens`` tokens in sequences whose squared lengths sum to
        ``squared_lengths``."""
        return self.per_token * tokens + self.per_squared_length * squared_lengths


class Weight(NamedTuple):
    """One parameter of a model as its engine holds it, with its full shape.

    Attributes:
        module: The module that uses it (a tied weight appears once per module).
        identity: The same for every appearance of one parameter.
        shape: Its full (unsharded) shape.
        trained: Whether it requires a gradient.
    """

    module: Any
    identity: Hashable
    shape: tuple[int, ...]
    trained: bool


def _flat_parameters(model: Any) -> list[Any]:
    """FSDP1's ``FlatParameter`` objects of ``model`` (registered on the wrappers, or held by their
    handles when ``use_orig_params=True`` registers views of them instead)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        handle = getattr(module, "_handle", None)
        candidates = [getattr(handle, "flat_param", None), *module.parameters(recurse=False)]
        for candidate in candidates:
            if candidate is not None and hasattr(candidate, "_param_infos") and hasattr(candidate, "_shapes"):
                found[id(candidate)] = candidate
    return list(found.values())


def full_weights(model: Any) -> Iterator[Weight]:
    """Every parameter of ``model`` with its full shape, whatever engine shards it: FSDP1's
    original parameters from the ``FlatParameter`` metadata, ZeRO-3's ``ds_shape``, a DTensor's
    global shape (``.shape``), else the tensor's own shape.

    Args:
        model: A torch module, sharded or not.
    """
    described: set[tuple[int, str]] = set()
    for flat in _flat_parameters(model):
        originals = getattr(flat, "_params", None)  # use_orig_params=True: the original parameters
        for index, (info, shape) in enumerate(zip(flat._param_infos, flat._shapes)):
            trained = originals[index].requires_grad if originals else flat.requires_grad
            identity = (id(info.module), info.param_name)
            described.add(identity)
            yield Weight(info.module, identity, tuple(shape), bool(trained))
        for shared in getattr(flat, "_shared_param_infos", ()):
            primary = (id(shared.prim_module), shared.prim_param_name)
            described.add((id(shared.module), shared.param_name))
            index = next(i for i, info in enumerate(flat._param_infos)
                         if (id(info.module), info.param_name) == primary)
            trained = originals[index].requires_grad if originals else flat.requires_grad
            yield Weight(shared.module, primary, tuple(flat._shapes[index]), bool(trained))
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if hasattr(parameter, "_param_infos") or (id(module), name) in described:
                continue
            shape = getattr(parameter, "ds_shape", None)  # DeepSpeed ZeRO-3: a placeholder of shape [0]
            yield Weight(module, id(parameter), tuple(shape if shape is not None else parameter.shape),
                         bool(parameter.requires_grad))


def reentrant_checkpointing(model: Any) -> bool:
    """True when a module of ``model`` recomputes its forward with reentrant activation
    checkpointing (transformers' ``gradient_checkpointing_kwargs={"use_reentrant": True}``; trl
    sets it for a PEFT model under ZeRO-3), whose backward ``torch.autograd.grad`` with ``inputs``
    cannot follow."""
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is not True:
            continue
        function = getattr(module, "_gradient_checkpointing_func", None)
        if (getattr(function, "keywords", None) or {}).get("use_reentrant") is True:
            return True
    return False


def _product_parameters(model: Any) -> tuple[int, int]:
    """``(P, P_t)``: parameters of the weight products, and those of them that are trained."""
    import torch

    seen: set[Hashable] = set()
    total = trained = 0
    for weight in full_weights(model):
        if isinstance(weight.module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            continue
        if len(weight.shape) < 2 or weight.identity in seen:
            continue
        seen.add(weight.identity)
        numel = 1
        for size in weight.shape:
            numel *= int(size)
        total += numel
        if weight.trained:
            trained += numel
    return total, trained


def _base_model(model: Any) -> Any:
    """The model inside a peft wrapper (``PeftModel.get_base_model()``), else ``model``."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _attention_shape(config: Any) -> Optional[tuple[int, int]]:
    """``(layers, heads x head_dim)`` of a decoder-only or encoder-only transformer's config."""
    if config is None or getattr(config, "is_encoder_decoder", False):
        return None
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        config = get_text_config()
    layers = next((getattr(config, n) for n in ("num_hidden_layers", "n_layer", "num_layers")
                   if isinstance(getattr(config, n, None), int)), None)
    heads = next((getattr(config, n) for n in ("num_attention_heads", "n_head")
                  if isinstance(getattr(config, n, None), int)), None)
    if not layers or not heads:
        return None
    head_dim = getattr(config, "head_dim", None)
    if not isinstance(head_dim, int):
        hidden = next((getattr(config, n) for n in ("hidden_size", "n_embd", "d_model")
                       if isinstance(getattr(config, n, None), int)), None)
        if not hidden:
            return None
        head_dim = hidden // heads
    return layers, heads * head_dim


def training_flops(model: Any) -> TrainingFlops:
    """Count the training FLOPs of ``model`` from its weights and its config (module docstring).

    Args:
        model: A torch module; a peft model is counted with its adapters (trained) and frozen
            base weights. Attention is counted when its config gives the layers and heads
            (decoder-only and encoder-only transformers), else left out.

    Returns:
        The count; ``per_squared_length`` is 0 when the attention shape is unknown.
    """
    total, trained = _product_parameters(model)
    shape = _attention_shape(getattr(_base_model(model), "config", None))
    attention = 12.0 * shape[0] * shape[1] if shape is not None else 0.0
    return TrainingFlops(per_token=4.0 * total + 2.0 * trained, per_squared_length=attention,
                         source="config", parameters=total, trained_parameters=trained)


def loss_shifts_labels(model: Any) -> bool:
    """True when the model's loss shifts its labels (a causal LM: position ``i`` predicts
    label ``i + 1``, so ``labels[..., 0]`` is never a target): the loss function the model
    resolves (its ``_loss_function``, else transformers' ``LOSS_MAPPING`` for its ``loss_type``,
    else transformers' default, ``ForCausalLMLoss``) is ``ForCausalLMLoss``, and it is not an
    encoder-decoder. ``Trainer`` applies the same rule but without the default, so it counts
    ``GPT2LMHeadModel``'s labels unshifted although its loss shifts them."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    except ImportError:  # transformers < 4.46 has no loss mapping: read the class name
        return type(base).__name__.endswith(("ForCausalLM", "LMHeadModel"))
    if not hasattr(base, "loss_type"):  # not a transformers model
        return False
    function = getattr(base, "_loss_function", None) or LOSS_MAPPING.get(base.loss_type, ForCausalLMLoss)
    return function is ForCausalLMLoss


def measure_training_flops(model: Any, inputs: Mapping[str, Any]) -> float:
    """FLOPs of one forward and backward pass of ``model`` on ``inputs``, counted by
    ``torch.utils.flop_counter``.

    The gradients go to ``torch.autograd.grad``, not to the weights' ``.grad``, and the random
    state is restored, so training continues exactly as without the measurement.

    Args:
        model: The model, in the mode it trains in.
        inputs: Keyword arguments of one forward pass (with ``labels``, so that it returns a
            loss; without a loss the sum of the first output that needs a gradient is used).

    Raises:
        ValueError: The forward pass returns nothing that needs a gradient.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    trained = [p for p in model.parameters() if p.requires_grad]
    cuda = {p.device.index for p in trained if p.device.type == "cuda" and p.device.index is not None}
    devices = sorted(cuda)
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas())
    with torch.random.fork_rng(devices=devices), counter:
        outputs = model(**inputs)
        loss = _loss_of(outputs)
        if loss is None:
            raise ValueError(
                f"measure_training_flops: the forward pass of {type(model).__name__} returned no tensor "
                "that needs a gradient; pass inputs with labels, or a number as flops_per_token."
            )
        torch.autograd.grad(loss, trained, allow_unused=True)
    return float(counter.get_total_flops())


def _cpu_attention_formulas() -> dict[Any, Any]:
    """FLOP formulas for PyTorch's CPU attention kernel, which ``flop_counter`` lacks (it counts
    the CUDA kernels): the same counts as its ``sdpa_flop_count`` and ``sdpa_backward_flop_count``."""
    import torch
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    count, count_backward = (getattr(flop_counter, "sdpa_flop_count", None),
                             getattr(flop_counter, "sdpa_backward_flop_count", None))
    if forward is None or backward is None or count is None or count_backward is None:
        return {}

    def forward_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                      **kwargs: Any) -> int:
        return count(query, key, value)

    def backward_flops(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                       **kwargs: Any) -> int:
        return count_backward(grad_out, query, key, value)

    return {forward: forward_flops, backward: backward_flops}


def _loss_of(outputs: Any) -> Any:
    import torch

    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss.sum()
    values = outputs.values() if isinstance(outputs, Mapping) else (
        outputs if isinstance(outputs, (tuple, list)) else [outputs])
    for value in values:
        if isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point():
            return value.sum()
    return None
