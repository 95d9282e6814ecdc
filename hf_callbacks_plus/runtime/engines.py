"""What callbacks need to know about the engine that shards a model, in one place.

A stock ``transformers.Trainer`` (and trl's trainers, and ``TrainerPlus``) hands callbacks the
model as its engine holds it:

* **DeepSpeed ZeRO-3**: the unwrapped module; every parameter is a placeholder of ``numel() ==
  0`` with ``ds_id``/``ds_numel``/``ds_shape`` and this rank's partition in ``ds_tensor``; the
  module's hooks gather each layer's parameters around its forward (a collective). With ZeRO-1,
  2 and 3 the optimizer (behind accelerate's wrapper) also holds this rank's partition of the
  fp32 **master weights**, which the optimizer step copies into the model's parameters.
* **FSDP1** (``FullyShardedDataParallel``): the wrapper; each wrapped module holds a 1-D
  ``FlatParameter`` whose ``_local_shard`` is this rank's part; the wrapper's forward gathers it.
* **FSDP2** (``fully_shard``): the module itself; every parameter is a ``DTensor`` whose
  ``to_local()`` is this rank's rows; each ``FSDPModule``'s forward gathers its parameters.

Two things follow, used by ``GenerationSamples`` and ``EarlyStopping(restore_best=True)``:

* `generation_model`: a model whose forward gathers parameters runs generation on **every**
  rank, each step together (``synced_gpus``), with the engine gathering what it gathers for its
  own forward: no more memory than that.
* `local_tensors` / `copy_local` / `load_local`: what this rank holds of the weights training
  changes (its ZeRO master partition, its FSDP shards), to keep a copy of and put back with no
  gather and one shard of memory.

Only ``torch`` is imported, inside the functions; DeepSpeed and FSDP are recognised by the
attributes they put on the model and optimizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

__all__ = [
    "clean_parameter_name",
    "copy_local",
    "copy_optimizer_state",
    "generation_model",
    "holds_a_share",
    "layout",
    "load_local",
    "load_optimizer_state",
    "local_gradients",
    "local_segments",
    "local_tensors",
    "sharding_engine",
    "torch_optimizer",
    "zero_optimizer",
]

#: The ZeRO optimizer's list of this rank's fp32 master partitions, by stage.
_ZERO3_MASTERS = "fp32_partitioned_groups_flat"
_ZERO12_MASTERS = "single_partition_of_fp32_groups"
#: The key prefix of a ZeRO master partition in `local_tensors`.
ZERO_MASTER_KEY = "zero_fp32_partition."
#: The key prefix of an FSDP1 flat parameter's local shard in `local_tensors`.
FSDP1_SHARD_KEY = "fsdp1_flat_param."


def _fsdp1_class() -> Any:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # torch built without distributed
        return None
    return FullyShardedDataParallel


def _fsdp2_module_class() -> Any:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    return FSDPModule


def _is_dtensor(tensor: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(tensor, DTensor)


def sharding_engine(model: Any) -> Optional[str]:
    """Which engine shards ``model``'s parameters across processes: ``"zero3"`` (DeepSpeed's
    partitioned parameters), ``"fsdp1"`` (``FullyShardedDataParallel`` flat parameters),
    ``"fsdp2"`` (``fully_shard`` DTensors), or None (every rank holds whole parameters: one
    process, DDP, DeepSpeed ZeRO-1/2).

    Args:
        model: The model as the trainer hands it to callbacks (anything with ``modules()`` and
            ``parameters()``; other objects give None).
    """
    if not callable(getattr(model, "modules", None)) or not callable(getattr(model, "parameters", None)):
        return None
    fsdp1 = _fsdp1_class()
    if fsdp1 is not None and any(isinstance(module, fsdp1) for module in model.modules()):
        return "fsdp1"
    for parameter in model.parameters():
        if hasattr(parameter, "ds_id"):
            return "zero3"
        if _is_dtensor(parameter):
            return "fsdp2"
        if type(parameter).__name__ == "FlatParameter":  # FSDP1's, registered without its wrapper
            return "fsdp1"
    return None


def zero_optimizer(optimizer: Any) -> Any:
    """The DeepSpeed ZeRO optimizer (stage 1, 2 or 3) behind ``optimizer`` (accelerate's
    ``AcceleratedOptimizer``/``DeepSpeedOptimizerWrapper``, the engine's own), or None."""
    for _ in range(6):
        if optimizer is None:
            return None
        if hasattr(optimizer, _ZERO3_MASTERS) or hasattr(optimizer, _ZERO12_MASTERS):
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
    return None


def _fsdp2_roots(model: Any) -> list[Any]:
    """The outermost ``FSDPModule`` s of ``model`` (``model`` itself after ``fully_shard(model)``)."""
    fsdp_module = _fsdp2_module_class()
    if fsdp_module is None:
        return []
    roots: list[Any] = []
    inner: set[int] = set()
    for module in model.modules():
        if id(module) in inner or not isinstance(module, fsdp_module):
            continue
        roots.append(module)
        inner.update(id(sub) for sub in module.modules())
    return roots


@contextlib.contextmanager
def generation_model(model: Any) -> Iterator[tuple[Any, bool]]:
    """Make ``model`` ready to ``generate``: yields ``(module, every_rank)``.

    ``module`` is what to call ``generate`` on; ``every_rank`` is True when its forward gathers
    parameters from the other ranks (ZeRO-3, FSDP1, FSDP2): then every rank must call
    ``generate`` the same number of times, each with ``synced_gpus=True`` so that a rank whose
    sequences finished early still runs the forward passes the others need. What is gathered is
    what the engine gathers for its own forward, no more:

    * ZeRO-3: nothing to do; DeepSpeed's hooks gather each layer around its forward.
    * FSDP1: the wrapper's own (root) flat parameter is gathered for the context
      (``summon_full_params(recurse=False)``: the embeddings, final norm and head outside the
      wrapped layers, which the wrapper's forward would gather); ``module`` is the wrapped model,
      whose wrapped layers gather themselves.
    * FSDP2: the outermost ``FSDPModule`` is unsharded for the context (``unshard()``, as its
      forward would; ``generate`` of a peft model calls the inner model, past that hook) and
      resharded after; each inner ``FSDPModule`` gathers itself.

    A collective when ``every_rank``: every rank enters it at the same point.
    """
    engine = sharding_engine(model)
    if engine == "fsdp1":
        fsdp1 = _fsdp1_class()
        if isinstance(model, fsdp1):
            with fsdp1.summon_full_params(model, recurse=False, writeback=False):
                yield model.module, True
        else:  # wrapped layers inside a plain module: their forwards gather themselves
            yield model, True
        return
    if engine == "fsdp2":
        roots = _fsdp2_roots(model)
        for root in roots:
            root.unshard()
        try:
            yield model, True
        finally:
            for root in roots:
                root.reshard()
        return
    yield model, engine == "zero3"


# -- this rank's part of the trained weights --------------------------------------------------------


def _zero_masters(zero: Any) -> list[Any]:
    masters = getattr(zero, _ZERO3_MASTERS, None)
    if masters is None:
        masters = getattr(zero, _ZERO12_MASTERS)
    return list(masters)


def _check_zero(zero: Any) -> None:
    """Refuse what `load_local` cannot put back exactly: masters swapped out to NVMe."""
    if getattr(zero, "swap_optimizer", False) or getattr(zero, "params_in_nvme_and_cpu", False):
        raise RuntimeError(
            "DeepSpeed ZeRO offloads the optimizer or the parameters to NVMe here (offload_optimizer/"
            "offload_param device 'nvme'), so this rank's master weights are not in memory to copy; "
            "offload to 'cpu' or 'none', or use checkpoints (load_best_model_at_end=True)."
        )
    if hasattr(zero, _ZERO3_MASTERS):
        needed = ("fp16_partitioned_groups_flat", "checkpoint_event_prologue", "checkpoint_event_epilogue")
    else:
        needed = ("update_lp_params",)
    missing = [name for name in needed if not hasattr(zero, name)]
    if missing:
        raise RuntimeError(
            f"this DeepSpeed's ZeRO optimizer ({type(zero).__name__}) has no {', '.join(missing)}: the "
            "best weights cannot be put back into its parameters (tested with deepspeed 0.19)."
        )


def _persistent_buffers(model: Any) -> Iterator[tuple[str, Any]]:
    """``(name, buffer)`` for the buffers a ``state_dict`` holds (not the non-persistent ones)."""
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        skip = getattr(module, "_non_persistent_buffers_set", set())
        for name, buffer in module.named_buffers(recurse=False):
            if name in skip or id(buffer) in seen:
                continue
            seen.add(id(buffer))
            yield (f"{prefix}.{name}" if prefix else name), buffer


def _reshard_fsdp2(model: Any) -> None:
    """Free every unsharded FSDP2 parameter group, so that the registered parameters are the
    DTensor shards (an evaluation leaves the outermost module unsharded) and the next forward
    gathers from the shards again."""
    fsdp_module = _fsdp2_module_class()
    for module in model.modules():
        if fsdp_module is not None and isinstance(module, fsdp_module):
            module.reshard()


def _fsdp1_handles(model: Any) -> list[Any]:
    fsdp1 = _fsdp1_class()
    handles = []
    for module in fsdp1.fsdp_modules(model):
        handle = getattr(module, "_handle", None)
        if handle is not None and getattr(handle, "flat_param", None) is not None:
            handles.append(handle)
    return handles


def local_tensors(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """The live tensors that hold this rank's part of what training changes, by a stable key.

    * DeepSpeed ZeRO (any stage; found through ``optimizer``): this rank's fp32 master
      partitions (``zero_fp32_partition.<i>``): the optimizer step copies them into the model's
      parameters, and ZeRO's checkpoints hold them;
    * FSDP1: the local shard of each flat parameter that holds a trained parameter
      (``fsdp1_flat_param.<i>``, in ``fsdp_modules`` order);
    * FSDP2 and any other model: each trained parameter's local tensor (``to_local()`` of a
      DTensor) by its name;
    * and, for every engine, the persistent buffers (whole on every rank) by their names.

    Frozen parameters (a LoRA model's base) are left out: training does not change them.
    Under FSDP2 the parameter groups are resharded first (a local operation).

    Raises:
        RuntimeError: ZeRO-3 parameters without their ZeRO optimizer in ``optimizer``, or a
            ZeRO optimizer whose masters are not in memory (NVMe offload).
    """
    tensors: dict[str, Any] = {}
    engine = sharding_engine(model)
    zero = zero_optimizer(optimizer)
    if zero is not None:
        _check_zero(zero)
        for index, master in enumerate(_zero_masters(zero)):
            tensors[f"{ZERO_MASTER_KEY}{index}"] = master
    elif engine == "zero3":
        raise RuntimeError(
            "the model's parameters are partitioned by DeepSpeed ZeRO-3 but its ZeRO optimizer was not "
            f"given (optimizer={type(optimizer).__name__}): this rank's master weights live there."
        )
    elif engine == "fsdp1":
        for index, handle in enumerate(_fsdp1_handles(model)):
            flat = handle.flat_param
            if flat.requires_grad:
                tensors[f"{FSDP1_SHARD_KEY}{index}"] = getattr(flat, "_local_shard", flat)
    else:
        if engine == "fsdp2":
            _reshard_fsdp2(model)
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                tensors[name] = parameter.to_local() if _is_dtensor(parameter) else parameter
    for name, buffer in _persistent_buffers(model):
        tensors[name] = buffer
    return tensors


def copy_local(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """CPU copies of `local_tensors` (no collective: one shard of memory per rank)."""
    tensors = local_tensors(model, optimizer)
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()}


def layout(tensors: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, dtype)}`` of `local_tensors` or a copy of them, to compare two."""
    return {name: (tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))
            for name, tensor in tensors.items()}


def load_local(model: Any, optimizer: Any, copy: dict[str, Any]) -> None:
    """Put a `copy_local` copy back into this rank's tensors, then let the engine's parameters
    follow as its own optimizer step makes them follow:

    * ZeRO-3: as DeepSpeed loads a checkpoint, every parameter is released (the persistent ones,
      kept whole on every rank, too), the masters are copied into the partitions (``ds_tensor``),
      and the persistent parameters are gathered again (``checkpoint_event_prologue`` /
      ``_epilogue``);
    * ZeRO-1/2: the masters are copied into this rank's partition of the model's parameters and
      the partitions gathered (DeepSpeed's ``update_lp_params``, an all-gather like each step's);
    * FSDP1 / FSDP2: gathered parameters kept from the last forward are freed, so the next
      forward or state dict gathers from the shards put back.

    A collective under ZeRO (every rank calls it at the same point).

    Raises:
        ValueError: The copy does not fit this rank's tensors (other keys or shapes: another
            model, world size or engine).
    """
    import torch

    tensors = local_tensors(model, optimizer)
    if layout(tensors) != layout(copy):
        differ = sorted(set(layout(tensors).items()) ^ set(layout(copy).items()))[:4]
        raise ValueError(f"the kept copy of the weights does not fit this model on this rank (first "
                         f"differences, key/(shape, dtype): {differ}).")
    engine, zero = sharding_engine(model), zero_optimizer(optimizer)
    if engine == "fsdp1":
        for handle in _fsdp1_handles(model):  # free what the last forward left gathered
            if handle.uses_sharded_strategy:
                handle.reshard(True)
                handle.post_reshard()
    zero3 = zero is not None and hasattr(zero, _ZERO3_MASTERS)
    if zero3:  # as ZeRO-3 loads a checkpoint: release every gathered parameter, persistent ones too
        zero.checkpoint_event_prologue()
    with torch.no_grad():
        for name, tensor in tensors.items():
            tensor.copy_(copy[name])
    if zero is None:
        return
    if zero3:
        with torch.no_grad():  # the masters into the partitioned parameters, as after a step
            for index, master in enumerate(zero.fp32_partitioned_groups_flat):
                partition = zero.fp16_partitioned_groups_flat[index]
                if partition is not None and master.numel() > 0:
                    partition.data.copy_(master.data)
                    unflatten = getattr(zero, "_unflatten_partitioned_parameters", None)
                    if callable(unflatten):
                        unflatten(index)
        zero.checkpoint_event_epilogue()  # gathers the persistent parameters again
    else:
        zero.update_lp_params()


# -- this rank's part of the optimizer's state, and where each parameter lies in local_tensors ------


def torch_optimizer(optimizer: Any) -> Any:
    """The innermost optimizer behind ``optimizer``: the one whose ``state`` holds this rank's moments
    (under DeepSpeed ZeRO the torch optimizer stepping the fp32 master partitions; under accelerate
    the wrapped torch optimizer; else ``optimizer`` itself). None for None."""
    for _ in range(6):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or not hasattr(inner, "param_groups"):
            return optimizer
        optimizer = inner
    return optimizer


def _local(tensor: Any) -> Any:
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def _optimizer_parameters(optimizer: Any) -> list[Any]:
    inner = torch_optimizer(optimizer)
    return [parameter for group in inner.param_groups for parameter in group["params"]]


def copy_optimizer_state(optimizer: Any) -> list[dict[str, Any]]:
    """CPU copies of this rank's optimizer state, one dict per parameter of `torch_optimizer` (in
    ``param_groups`` order; a DTensor's local shard; an empty dict for a parameter without state
    yet). No collective."""
    import copy as _copy

    inner = torch_optimizer(optimizer)
    copies = []
    for parameter in _optimizer_parameters(optimizer):
        state = inner.state.get(parameter, {})
        copies.append({key: _local(value).detach().to("cpu", copy=True) if hasattr(value, "detach")
                       else _copy.deepcopy(value) for key, value in state.items()})
    return copies


def load_optimizer_state(optimizer: Any, copies: list[dict[str, Any]]) -> None:
    """Put a `copy_optimizer_state` copy back, in place (a parameter copied without state gets none:
    the optimizer starts it again at its next step, as it did the first time).

    Raises:
        ValueError: The copy does not fit this optimizer (another number of parameters or shapes).
    """
    import torch

    inner = torch_optimizer(optimizer)
    parameters = _optimizer_parameters(optimizer)
    if len(parameters) != len(copies):
        raise ValueError(f"the kept optimizer state holds {len(copies)} parameters, this optimizer "
                         f"{len(parameters)}.")
    with torch.no_grad():
        for parameter, kept in zip(parameters, copies):
            if not kept:
                inner.state.pop(parameter, None)
                continue
            state = inner.state[parameter]
            for key, value in kept.items():
                live = state.get(key)
                if hasattr(value, "detach") and hasattr(live, "detach") and tuple(_local(live).shape) == \
                        tuple(value.shape):
                    _local(live).copy_(value)
                elif hasattr(value, "detach") and hasattr(live, "detach"):
                    raise ValueError(f"the kept optimizer state {key!r} has shape {tuple(value.shape)}, "
                                     f"the live one {tuple(_local(live).shape)}.")
                else:
                    state[key] = value.clone() if hasattr(value, "clone") else value


def clean_parameter_name(name: str) -> str:
    """A parameter's name without the wrappers FSDP, activation checkpointing and ``torch.compile`` add."""
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


def local_segments(model: Any, optimizer: Any = None) -> dict[str, list[tuple[str, int, int]]]:
    """Where each trained parameter lies in this rank's `local_tensors`: ``{key: [(parameter name,
    start, numel), ...]}`` over the flattened tensor of ``key``, this rank's elements only (FSDP1 and
    ZeRO padding left out). Parameter names are the model's own, without FSDP/compile wrappers.

    * ZeRO-1/2: each parameter's fragment of the master partition (DeepSpeed's ``_hp_mapping``);
    * ZeRO-3: each parameter's partition (``ds_tensor``) in the flat master partition of its group;
    * FSDP1: each original parameter's slice of the flat local shard (``_shard_param_infos``);
    * FSDP2 and any other model: the parameter's local tensor, whole.

    No collective. Under DDP or a single process every rank holds whole parameters (see
    `holds_a_share`).
    """
    names = {id(parameter): clean_parameter_name(name) for name, parameter in model.named_parameters()}
    segments: dict[str, list[tuple[str, int, int]]] = {}
    zero = zero_optimizer(optimizer)
    if zero is not None:
        if hasattr(zero, _ZERO3_MASTERS):
            import torch.distributed as dist

            group_of = getattr(zero, "dp_process_group", None)
            rank = dist.get_rank(group=group_of) if dist.is_initialized() else 0
            for index, group in enumerate(zero.fp16_groups):
                found, offset = [], 0
                for parameter in group:
                    size = parameter.partition_numel()
                    valid = max(0, min(size, int(parameter.ds_numel) - rank * size))
                    found.append((names.get(id(parameter), f"?{index}.{len(found)}"), offset, valid))
                    offset += size
                segments[f"{ZERO_MASTER_KEY}{index}"] = found
        else:
            for index, group in enumerate(zero.bit16_groups):
                found = []
                for parameter in group:
                    mapping = getattr(parameter, "_hp_mapping", None)
                    if mapping is not None:
                        address = mapping.get_hp_fragment_address()
                        found.append((names.get(id(parameter), "?"), int(address.start), int(address.numel)))
                segments[f"{ZERO_MASTER_KEY}{index}"] = found
        return segments
    if sharding_engine(model) == "fsdp1":
        fsdp1 = _fsdp1_class()
        prefixes = {id(module): clean_parameter_name(name) for name, module in model.named_modules()}
        index = 0
        for module in fsdp1.fsdp_modules(model):
            handle = getattr(module, "_handle", None)
            flat = getattr(handle, "flat_param", None)
            if flat is None:
                continue
            if flat.requires_grad:
                prefix = prefixes.get(id(module), "")
                found = []
                for fqn, info in zip(flat._fqns, flat._shard_param_infos):
                    if info.in_shard:
                        name = clean_parameter_name(f"{prefix}.{fqn}" if prefix else fqn)
                        found.append((name, int(info.offset_in_shard), int(info.numel_in_shard)))
                segments[f"{FSDP1_SHARD_KEY}{index}"] = found
            index += 1
        return segments
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            segments[name] = [(clean_parameter_name(name), 0, _local(parameter).numel())]
    return segments


def holds_a_share(model: Any, optimizer: Any = None) -> bool:
    """Whether this rank's `local_tensors` are its own share of the trained weights (ZeRO, FSDP1, FSDP2:
    a sum over ranks gives the whole), rather than whole copies (a single process, DDP)."""
    return zero_optimizer(optimizer) is not None or sharding_engine(model) in ("fsdp1", "fsdp2", "zero3")


def local_gradients(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """The gradient of each trained tensor of `local_tensors`, in its layout (None where there is none):
    ZeRO: the master partition's ``.grad``, which DeepSpeed sets only inside its step, unscaled and
    clipped (a hook on `torch_optimizer`'s step sees it); FSDP1: the flat parameter's sharded
    gradient; FSDP2: the local shard of the gradient; otherwise ``parameter.grad``."""
    gradients: dict[str, Any] = {}
    zero = zero_optimizer(optimizer)
    if zero is not None:
        for index, master in enumerate(_zero_masters(zero)):
            gradients[f"{ZERO_MASTER_KEY}{index}"] = master.grad
        return gradients
    if sharding_engine(model) == "fsdp1":
        for index, handle in enumerate(_fsdp1_handles(model)):
            if handle.flat_param.requires_grad:
                gradients[f"{FSDP1_SHARD_KEY}{index}"] = handle.flat_param.grad
        return gradients
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            gradients[name] = None if parameter.grad is None else _local(parameter.grad)
    return gradients
