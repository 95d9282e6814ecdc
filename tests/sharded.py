"""Real sharding engines on 2 CPU ranks, through a stock ``transformers.Trainer``, for scenarios.

A scenario (tests/distributed.py) trains under DeepSpeed ZeRO-1/2/3, FSDP2 or FSDP1 exactly as a
user would, with ``TrainingArguments(deepspeed=...)`` / ``fsdp=...``, on the 2 gloo ranks of the
suite's one ``torchrun`` launch. Everything here is test-only: the package never patches an engine.

    from tests import sharded

    def my_scenario(out: Path, engine: str) -> None:
        with sharded.sharded_on_cpu():  # every engine needs it; use the trainer only inside
            trainer = sharded.make_trainer(engine, out / "run", callbacks=[MyCallback()],
                                           eval_strategy="steps", eval_steps=2)
            trainer.train()
            weights = sharded.full_weights(trainer)  # a collective: both ranks call it
            sharded.write_json(out, {"history": sharded.records(trainer),
                                     "lm_head": weights["lm_head.weight"].sum().item()})

    @pytest.mark.parametrize("engine", sharded.engine_scenarios(my_scenario, first_tier=("zero3", "fsdp2")))
    def test_my_callback(engine, distributed_outcome):
        rank0, rank1 = distributed_outcome.json()  # what each rank wrote with write_json
        ...

The parts:

* ``ENGINES``: ``ddp`` (the reference: plain DDP, full parameters on every rank), ``zero1``,
  ``zero2``, ``zero3`` (DeepSpeed, ``DS_ACCELERATOR=cpu``; ZeRO-3 parameters are placeholders
  of ``numel() == 0`` with ``ds_numel``/``ds_tensor``), ``fsdp2`` (``fully_shard``: DTensors
  split on dim 0, ``SHARDED_STATE_DICT``), ``fsdp2_full`` (the same with ``FULL_STATE_DICT``),
  ``fsdp1_full`` and ``fsdp1_sharded`` (FSDP1 flat parameters: 1-D shards; the two state-dict
  types). ``TRAINERS``: ``trainer`` (stock), ``trainer_plus`` (our ``TrainerPlus``),
  ``sft_lora`` (trl ``SFTTrainer`` with a peft LoRA).
* ``engine_args(engine, output_dir, **training_kwargs)``: the ``TrainingArguments`` (or
  ``args_class``, e.g. ``trl.SFTConfig``) of that engine; ``deepspeed={...}`` and
  ``fsdp_config={...}`` given here are merged into the engine's own.
* ``sharded_on_cpu()``: the context every engine scenario runs in (see its docstring: the FSDP
  patch of accelerate's state, DeepSpeed's CPU accelerator without its JIT-built shared-memory
  op, and accelerate/DeepSpeed global state reset on the way in and out). Build and run the
  trainer inside it.
* ``make_trainer(engine, output_dir, trainer=..., callbacks=..., **training_kwargs)``: a tiny
  2-layer Llama (``tiny_lm.causal_lm``: the same seeded weights for every engine) on tokenized
  rows of the demo corpus (``lm_rows``), or the text rows for ``sft_lora``; ``tokenizer()``
  and ``prompts(n)`` for generation.
* ``full_weights(trainer)``: every parameter gathered whole on every rank (a collective: call
  it on both ranks), named as in ``trainer.model``; ``saved_weights(checkpoint)``: the weights a
  ``checkpoint-N`` holds, read in one process from the engine's own files (consolidated,
  ZeRO shards or FSDP's distributed checkpoint), named the same; ``sharding(trainer)``: what
  each rank holds locally; ``engine_of(trainer)``: ``deepspeed``/``fsdp``/``ddp``;
  ``checkpoint_files(folder)``: the files of a checkpoint with their sizes;
  ``records(trainer)``: ``log_history`` without timings; ``write_json``/``read_json``: one
  file per rank in the scenario's folder.
* ``engine_scenarios(scenario, ...)``: ``pytest.param`` s that run ``scenario(out, engine[,
  trainer])`` in the launch, the engines outside ``first_tier`` marked ``second_tier``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

ENGINES = ("ddp", "zero1", "zero2", "zero3", "fsdp2", "fsdp2_full", "fsdp1_full", "fsdp1_sharded")
DEEPSPEED_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
#: engine: (FSDP version, state-dict type)
FSDP_ENGINES = {"fsdp2": (2, "SHARDED_STATE_DICT"), "fsdp2_full": (2, "FULL_STATE_DICT"),
                "fsdp1_full": (1, "FULL_STATE_DICT"), "fsdp1_sharded": (1, "SHARDED_STATE_DICT")}
TRAINERS = ("trainer", "trainer_plus", "sft_lora")
#: log_history keys that differ between any two runs
TIMING = ("runtime", "per_second", "preparation_time")
SEQUENCE_LENGTH = 16
#: What each engine writes in ``checkpoint-4`` of the stock Trainer (2 ranks; the Trainer is given
#: a tokenizer), in parts: tests/test_sharded_engines.py checks the files against it and
#: tests/core/test_checkpoint_files.py classifies them.
COMMON = {"trainer_state.json", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"}
METADATA = {"config.json", "generation_config.json", "training_args.bin", "tokenizer.json",
            "tokenizer_config.json"}
ZERO = {"latest", "zero_to_fp32.py", "zero_to_torch.py",
        "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt"}
ZERO3_MODEL = {"global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt",
               "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"}
DCP = {"pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp_0/__0_0.distcp",
       "pytorch_model_fsdp_0/__1_0.distcp"}
DCP_OPTIMIZER = {"optimizer_0/.metadata", "optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp"}
LAYOUT = {
    "ddp": COMMON | METADATA | {"model.safetensors", "optimizer.pt"},
    "zero1": COMMON | METADATA | ZERO | {"model.safetensors", "global_step4/mp_rank_00_model_states.pt"},
    "zero3": COMMON | METADATA | ZERO | ZERO3_MODEL,
    "fsdp2": COMMON | DCP | DCP_OPTIMIZER,
    "fsdp2_full": COMMON | METADATA | {"model.safetensors", "pytorch_model_fsdp.bin", "optimizer.bin"},
}
LAYOUT["zero2"] = LAYOUT["zero1"]
LAYOUT["fsdp1_sharded"] = LAYOUT["fsdp2"]
LAYOUT["fsdp1_full"] = LAYOUT["fsdp2_full"]


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: expected one of {ENGINES}")


def deepspeed_config(stage: int) -> dict[str, Any]:
    """The DeepSpeed config of ZeRO stage ``stage``; "auto" values are filled by transformers."""
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # every parameter partitioned, however small
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "train_batch_size": "auto", "gradient_clipping": "auto"}


def fsdp_config(engine: str) -> dict[str, Any]:
    version, state_dict_type = FSDP_ENGINES[engine]
    config: dict[str, Any] = {"version": version, "state_dict_type": state_dict_type,
                              "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    if version == 1:
        config["sync_module_states"] = False  # True needs an accelerator to broadcast from
    return config


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def engine_args(engine: str, output_dir: str | Path, *, args_class: Any = None,
                **training_kwargs: Any) -> Any:
    """``TrainingArguments`` (or ``args_class``) for ``engine`` on the 2 CPU ranks.

    Defaults: 4 steps of 4 rows per rank, logging every step, no saving, no evaluation, seed 0,
    learning rate 1e-3; ``training_kwargs`` override them, and ``deepspeed``/``fsdp_config`` dicts
    are merged into the engine's own (``deepspeed={"zero_optimization":
    {"stage3_gather_16bit_weights_on_model_save": True}}``).
    """
    check_engine(engine)
    if args_class is None:
        from transformers import TrainingArguments as args_class
    values: dict[str, Any] = {
        "output_dir": str(output_dir), "use_cpu": True, "ddp_backend": "gloo", "report_to": "none",
        "disable_tqdm": True, "seed": 0, "dataloader_num_workers": 0, "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4, "learning_rate": 1e-3, "max_steps": 4, "logging_steps": 1,
        "save_strategy": "no",
    }
    extra_deepspeed = training_kwargs.pop("deepspeed", None) or {}
    extra_fsdp = training_kwargs.pop("fsdp_config", None) or {}
    if engine in DEEPSPEED_STAGES:
        values["deepspeed"] = _merged(deepspeed_config(DEEPSPEED_STAGES[engine]), extra_deepspeed)
    elif extra_deepspeed:
        raise ValueError(f"deepspeed={extra_deepspeed!r} given for engine={engine!r}")
    if engine in FSDP_ENGINES:
        values["fsdp"] = "full_shard auto_wrap"
        values["fsdp_config"] = _merged(fsdp_config(engine), extra_fsdp)
    elif extra_fsdp:
        raise ValueError(f"fsdp_config={extra_fsdp!r} given for engine={engine!r}")
    values.update(training_kwargs)
    return args_class(**values)


# -- the context ------------------------------------------------------------------------------


def _reset_engine_state() -> None:
    """Forget accelerate's process-wide state and transformers' ZeRO-3 flag (not the process group)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    except ImportError:
        return
    unset_hf_deepspeed_config()


@contextlib.contextmanager
def _fsdp_on_cpu() -> Iterator[None]:
    """accelerate 1.15 honours an FSDP plugin only on GPU-like process types: a CPU group stays
    ``MULTI_CPU`` and the Trainer falls back to DDP. Right after ``AcceleratorState.__init__``, a
    ``MULTI_CPU`` state given an FSDP plugin becomes ``FSDP`` (the Trainer then shards for real).
    FSDP1 also needs ``device_id``: accelerate passes ``PartialState.device``, which must be a
    CPU device without an index (torch refuses "cpu:0" against its "cpu" compute device). And
    FSDP1's ``FULL_STATE_DICT`` (``offload_to_cpu=True``, as accelerate asks) "moves" the gathered
    flat parameter to the CPU, a no-op on a CPU group, then frees its storage and reads it: a
    segfault; there the move is skipped (``FlatParamHandle.to_cpu``)."""
    import torch
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original_init = AcceleratorState.__init__
    original_to_cpu = FlatParamHandle.to_cpu

    @contextlib.contextmanager
    def to_cpu(self: Any) -> Iterator[None]:
        if self.device.type == "cpu":
            yield
        else:
            with original_to_cpu(self):
                yield

    def init(self, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.device = PartialState._shared_state["device"] = torch.device("cpu")

    AcceleratorState.__init__ = init
    FlatParamHandle.to_cpu = to_cpu
    try:
        yield
    finally:
        AcceleratorState.__init__ = original_init
        FlatParamHandle.to_cpu = original_to_cpu


@contextlib.contextmanager
def _deepspeed_on_cpu() -> Iterator[None]:
    """DeepSpeed on its CPU accelerator, without the shared-memory op it would JIT-build (~30-90 s)
    at its first ``init_distributed``: deepspeed builds it only when its ``__compatible_ops__``
    says so (``deepspeed.comm.torch.build_shm_op``), and without it every collective goes through
    the gloo group (the op only serves inference all-reduces)."""
    os.environ["DS_ACCELERATOR"] = "cpu"  # read at deepspeed's first get_accelerator()
    try:
        import deepspeed.ops
    except ImportError:
        yield
        return
    compatible = deepspeed.ops.__compatible_ops__
    name = "deepspeed_shm_comm"
    saved = compatible.get(name)
    compatible[name] = False
    try:
        yield
    finally:
        compatible[name] = saved


@contextlib.contextmanager
def sharded_on_cpu() -> Iterator[None]:
    """Where an engine scenario builds and runs its trainers (every engine, ``ddp`` included).

    On the way in and out it resets accelerate's process-wide state (``AcceleratorState``,
    ``PartialState``, ``GradientState``) and transformers' ZeRO-3 flag, so scenarios before and
    after start clean; inside, accelerate's FSDP plugin shards on a CPU group (``_fsdp_on_cpu``)
    and DeepSpeed runs on its CPU accelerator over gloo (``_deepspeed_on_cpu``). The process
    group itself stays up (the launch owns it); DeepSpeed keeps its communication backend and its
    clone of the world group for the whole launch, which later scenarios reuse.
    """
    _reset_engine_state()
    try:
        with _deepspeed_on_cpu(), _fsdp_on_cpu():
            yield
    finally:
        _reset_engine_state()


# -- the tiny model and data ------------------------------------------------------------------


def tokenizer() -> Any:
    """The tiny LM's word-level tokenizer (pad/bos/eos; about 400 words of the demo corpus)."""
    from tests.trl_peft import tiny_lm

    return tiny_lm.tokenizer()


def model(seed: int = 0) -> Any:
    """A seeded 2-layer Llama (hidden 32) from a config: the same weights on every rank and engine."""
    from tests.trl_peft import tiny_lm

    return tiny_lm.causal_lm(seed=seed)


def lm_rows(start: int, n: int) -> list[dict[str, list[int]]]:
    """``n`` demo-corpus texts from ``start``, tokenized to ``SEQUENCE_LENGTH`` (padded right);
    labels are the input ids, -100 on padding. Equal lengths: the default collator stacks them."""
    from tests.trl_peft import tiny_lm

    encode = tokenizer()
    rows = []
    for text in tiny_lm.texts()[start:start + n]:
        encoded = encode(text, truncation=True, max_length=SEQUENCE_LENGTH, padding="max_length")
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        rows.append({"input_ids": ids, "attention_mask": mask,
                     "labels": [token if keep else -100 for token, keep in zip(ids, mask)]})
    return rows


def prompts(n: int, words: int = 3) -> list[str]:
    """``n`` prompts of ``words`` words (held-out texts) for generation."""
    from tests.trl_peft import tiny_lm

    return [" ".join(text.split()[:words]) for text in tiny_lm.texts()[2000:2000 + n]]


N_TRAIN, N_EVAL = 32, 8


def make_trainer(engine: str, output_dir: str | Path, *, trainer: str = "trainer",
                 callbacks: Sequence[Any] = (), n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0,
                 **training_kwargs: Any) -> Any:
    """A trainer of kind ``trainer`` (one of ``TRAINERS``) under ``engine``, built inside
    ``sharded_on_cpu()``. The eval set is used when ``training_kwargs`` ask for evaluation.

    Every kind trains in fp32 by default (``sft_lora`` too: ``bf16=False`` unless given, where
    trl would default to bf16), so runs compare across kinds and engines."""
    if trainer not in TRAINERS:
        raise ValueError(f"trainer={trainer!r}: expected one of {TRAINERS}")
    if trainer == "sft_lora":
        import warnings

        import trl

        from tests.trl_peft import tiny_lm

        training_kwargs.setdefault("max_length", SEQUENCE_LENGTH)
        # trl defaults to bf16, which DeepSpeed turns into bf16 weights: fp32 as the other trainers
        training_kwargs.setdefault("bf16", False)
        args = engine_args(engine, output_dir, args_class=trl.SFTConfig, **training_kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return trl.SFTTrainer(model=model(seed), args=args, train_dataset=tiny_lm.sft_dataset(0, n_train),
                                  eval_dataset=tiny_lm.sft_dataset(1000, n_eval),
                                  processing_class=tokenizer(), peft_config=tiny_lm.lora_config(),
                                  callbacks=list(callbacks))
    if trainer == "trainer_plus":
        from hf_callbacks_plus.integrations.transformers import TrainerPlus as trainer_class
    else:
        from transformers import Trainer as trainer_class
    args = engine_args(engine, output_dir, **training_kwargs)
    return trainer_class(model=model(seed), args=args, train_dataset=lm_rows(0, n_train),
                         eval_dataset=lm_rows(1000, n_eval), processing_class=tokenizer(),
                         callbacks=list(callbacks))


# -- what a scenario reads back ---------------------------------------------------------------


def engine_of(trainer: Any) -> str:
    """``deepspeed``, ``fsdp`` or ``ddp``: how ``trainer`` wrapped its model."""
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "deepspeed"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "fsdp"
    return "ddp"


def _clean(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name


def full_weights(trainer: Any) -> dict[str, Any]:
    """Every parameter of ``trainer.model``, whole, as a CPU float tensor, on every rank.

    A collective under ZeRO-3 (``deepspeed.zero.GatheredParameters``), FSDP2 (``full_tensor()``)
    and FSDP1 (``summon_full_params``): call it on both ranks. Names are ``trainer.model``'s own
    (``model.layers.0.self_attn.q_proj.weight``; peft's ``base_model.model.`` prefix kept).
    """
    model = trainer.model
    if any(hasattr(p, "ds_numel") for p in model.parameters()):  # ZeRO-3 placeholders
        import deepspeed

        parameters = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(parameters.values()), modifier_rank=None):
            return {name: p.detach().clone().float() for name, p in parameters.items()}
    wrapped = trainer.model_wrapped
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(wrapped, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(wrapped, writeback=False, rank0_only=False):
            return {_clean(name): p.detach().clone().float() for name, p in wrapped.named_parameters()}
    from torch.distributed.tensor import DTensor

    weights = {}
    for name, p in model.named_parameters():
        tensor = p.full_tensor() if isinstance(p, DTensor) else p
        weights[name] = tensor.detach().clone().float()
    return weights


def sharding(trainer: Any) -> dict[str, Any]:
    """What this rank holds: the wrapper's class, and per parameter its kind (``tensor``,
    ``zero3`` placeholder, ``dtensor``, ``fsdp1_flat``), local shape and full numel."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    wrapped = trainer.model_wrapped
    parameters = {}
    if isinstance(wrapped, FullyShardedDataParallel):
        for name, p in wrapped.named_parameters():  # FSDP1: flat parameters or views of them
            parameters[_clean(name)] = {"kind": "fsdp1_flat", "local_shape": list(p.shape),
                                        "placements": None}
    else:
        for name, p in trainer.model.named_parameters():
            if hasattr(p, "ds_numel"):
                parameters[name] = {"kind": "zero3", "local_shape": list(p.shape), "numel": p.numel(),
                                    "ds_numel": int(p.ds_numel), "ds_shape": list(p.ds_shape),
                                    "ds_tensor_numel": int(p.ds_tensor.numel())}
            elif isinstance(p, DTensor):
                parameters[name] = {"kind": "dtensor", "local_shape": list(p.to_local().shape),
                                    "global_shape": list(p.shape),
                                    "placements": [str(x) for x in p.placements]}
            else:
                parameters[name] = {"kind": "tensor", "local_shape": list(p.shape)}
    flat = []
    if isinstance(wrapped, FullyShardedDataParallel):
        for module in FullyShardedDataParallel.fsdp_modules(wrapped):
            if module._flat_param is not None:  # FSDP1's own flat parameter
                flat.append({"local_shape": list(module._flat_param.shape),
                             "full_numel": module._flat_param._unpadded_unsharded_size.numel()})
    return {"wrapper": type(wrapped).__name__, "model": type(trainer.model).__name__,
            "parameters": parameters, "flat_parameters": flat}


def records(trainer: Any) -> list[dict[str, Any]]:
    """``trainer.state.log_history`` without the timing keys (they differ between any two runs)."""
    return [{k: v for k, v in record.items() if not any(t in k for t in TIMING)}
            for record in trainer.state.log_history]


def checkpoint_files(folder: str | Path) -> dict[str, int]:
    """Every file under ``folder`` (a ``checkpoint-N``): relative path -> size in bytes, sorted."""
    folder = Path(folder)
    return {str(path.relative_to(folder)): path.stat().st_size
            for path in sorted(folder.rglob("*")) if path.is_file()}


def write_json(out: Path, value: Any, name: str = "outcome") -> None:
    """Write ``value`` as this rank's ``<name>-rank<R>.json`` in the scenario folder."""
    rank = int(os.environ.get("RANK", "0"))
    (Path(out) / f"{name}-rank{rank}.json").write_text(json.dumps(value), encoding="utf-8")


def read_json(folder: Path, name: str = "outcome") -> list[Any]:
    """Both ranks' ``write_json`` values, rank 0 first."""
    return [json.loads((Path(folder) / f"{name}-rank{rank}.json").read_text(encoding="utf-8"))
            for rank in (0, 1)]


# -- the pytest side --------------------------------------------------------------------------


def engine_scenarios(scenario: Callable[..., None], engines: Sequence[str] = ENGINES,
                     first_tier: Sequence[str] = ENGINES, trainers: Sequence[str] | None = None,
                     reference: str | None = None, args: Sequence[str] = ()) -> list[Any]:
    """``pytest.param`` s running ``scenario(out, engine)`` (or ``scenario(out, engine, trainer)``
    for each of ``trainers``; then ``args``, more string arguments) in the launch; those whose
    engine is not in ``first_tier`` (and, with ``trainers``, whose trainer is not the first) are
    ``second_tier``. With ``reference`` (an engine, typically ``"ddp"``), the launch also runs the
    scenario under that engine (same trainer), which the test reads with
    ``distributed_launch.outcome(spec_of(scenario, args))``.

    Use with ``@pytest.mark.parametrize("engine", ...)`` (or ``("engine", "trainer")``, one more
    name per item of ``args``) and take ``distributed_outcome``.
    """
    import pytest

    for engine in (*engines, *first_tier, *([reference] if reference else [])):
        check_engine(engine)
    params = []
    for engine in engines:
        for trainer in (trainers or (None,)):
            values = ((engine,) if trainer is None else (engine, trainer)) + tuple(args)
            also = [] if reference is None else [(scenario, (reference, *values[1:]))]
            marks = [pytest.mark.distributed(scenario=scenario, args=values, also=also)]
            if engine not in first_tier or (trainer is not None and trainer != trainers[0]):
                marks.append(pytest.mark.second_tier)
            params.append(pytest.param(*values, marks=marks, id="-".join(values)))
    return params


def _peft_names(state: dict[str, Any]) -> dict[str, Any]:
    """peft saves an adapter's weights without the adapter's name (``...q_proj.lora_A.weight``, also
    in FSDP's sharded state dict); ``full_weights`` names them as the live model does
    (``...q_proj.lora_A.default.weight``)."""
    import re

    return {re.sub(r"\.(lora_[A-Za-z_]+)\.(?!default\.)", r".\1.default.", name): tensor
            for name, tensor in state.items()}


def saved_weights(checkpoint: str | Path) -> dict[str, Any]:
    """The model weights a ``checkpoint-N`` holds, read from the engine's own files in one process:
    ``model.safetensors`` when the trainer wrote consolidated weights, else ZeRO's ``global_step*/``
    (DeepSpeed's ``zero_to_fp32``), FSDP's sharded ``pytorch_model_fsdp_0/`` (torch distributed
    checkpoint) or a peft adapter (``adapter_model.safetensors``: the LoRA weights only). Names as
    ``full_weights`` gives them."""
    import torch

    checkpoint = Path(checkpoint)
    if (checkpoint / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(checkpoint / "model.safetensors")
        return _peft_names({name: tensor.detach().float() for name, tensor in state.items()})
    if (checkpoint / "latest").is_file():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(checkpoint)
        return _peft_names({name: tensor.detach().float() for name, tensor in state.items()})
    sharded = checkpoint / "pytorch_model_fsdp_0"
    if sharded.is_dir():
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as scratch:
            dcp_to_torch_save(sharded, Path(scratch) / "model.pt")
            state = torch.load(Path(scratch) / "model.pt", weights_only=True)
        state = state.get("model", state)
        return _peft_names({name: tensor.detach().float() for name, tensor in state.items()})
    adapter = checkpoint / "adapter_model.safetensors"
    if adapter.is_file():  # peft: the trained adapter only
        from safetensors.torch import load_file

        return _peft_names({name: tensor.detach().float() for name, tensor in load_file(adapter).items()})
    raise FileNotFoundError(f"{checkpoint}: no model.safetensors, ZeRO 'latest', pytorch_model_fsdp_0/ or "
                            "adapter_model.safetensors in "
                            f"{sorted(path.name for path in checkpoint.iterdir())}")
