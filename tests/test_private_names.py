"""Every private name of another library that the package relies on, checked against the
installed release: a transformers, trl, torch, DeepSpeed, torchmetrics, MLflow or TensorBoard release that
renames or drops one fails here, by name, instead of silently changing what we do.

The table is complete by construction: `test_the_table_names_every_private_name_the_package_uses`
reads the package with ``ast`` and fails on a private name (``x._name``, ``getattr(x, "_name")``,
``vars(x).get("_name")``) that the package does not define itself and the table does not list.
The same list is in ``docs/versions.md`` ("Private names we rely on").
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tiny_trainer(tmp_path: Path, trainer_class: Any = None, **args: Any) -> Any:
    from tests.tiny_models import make_trainer

    return make_trainer(tmp_path, trainer_class=trainer_class, **args)


# -- the checks: each reads the real installed class or instance -----------------------------------

def eval_loader_cache(tmp_path: Path) -> None:
    # transformers caches eval loaders here when workers persist (isolated_dataloader hides it)
    trainer = _tiny_trainer(tmp_path, dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer.get_eval_dataloader()
    assert isinstance(vars(trainer).get("_eval_dataloaders"), dict)


def seq2seq_generation_settings(tmp_path: Path) -> None:
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from tests.tiny_models import RegressionDataset, TinyRegressionModel

    args = Seq2SeqTrainingArguments(str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
                                    generation_num_beams=2)
    trainer = Seq2SeqTrainer(model=TinyRegressionModel(), args=args, eval_dataset=RegressionDataset(8))
    trainer.evaluate(max_new_tokens=3)
    assert vars(trainer)["_gen_kwargs"] == {"max_new_tokens": 3, "num_beams": 2}


def mlflow_store_creation(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.store.db import utils

    for name in ("_all_tables_exist", "_is_empty_database", "_safe_initialize_tables"):
        assert list(inspect.signature(getattr(utils, name)).parameters) == ["engine"], name


def loop_log_save_evaluate(tmp_path: Path) -> None:
    from transformers import Trainer

    calls = []

    class Spy(Trainer):
        def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(len(args) + len(kwargs))
            return super()._maybe_log_save_evaluate(*args, **kwargs)

    _tiny_trainer(tmp_path, trainer_class=Spy, max_steps=2).train()
    assert calls, "Trainer's loop no longer calls _maybe_log_save_evaluate (TrainerPlusMixin overrides it)"


def load_from_checkpoint(tmp_path: Path) -> None:
    from transformers import Trainer

    parameters = list(inspect.signature(Trainer._load_from_checkpoint).parameters)
    assert parameters[:2] == ["self", "resume_from_checkpoint"], parameters


def trl_accumulators(names: tuple[str, ...], trainers: tuple[str, ...]) -> Callable[[Path], None]:
    """The attributes each named trl trainer sets in ``__init__`` (read from its source: GRPO and
    RLOO need a generation backend to build)."""

    def check(tmp_path: Path) -> None:
        trl = pytest.importorskip("trl")
        for trainer in trainers:
            source = inspect.getsource(getattr(trl, trainer).__init__)
            missing = [name for name in names if f"self.{name} =" not in source]
            assert not missing, f"trl.{trainer}.__init__ no longer sets {missing}"

    return check


def trl_metrics_instance(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from tests.trl_peft import runs

    for kind in ("sft", "dpo", "reward"):
        trainer = runs.trainer(kind, tmp_path / kind, with_subset_eval=False)
        metrics = vars(trainer).get("_metrics")
        assert isinstance(metrics, dict) and set(metrics) == {"train", "eval"}, (kind, metrics)


def logging_window(tmp_path: Path) -> None:
    # Deadline carries the loss a trainer accumulates between two logs through a stop's checkpoint:
    # a tensor added to in place, the step of the last log, the sum of the logged losses
    import torch

    trainer = _tiny_trainer(tmp_path, max_steps=3, logging_steps=2)
    trainer.train()
    attributes = vars(trainer)
    assert isinstance(attributes.get("_tr_loss"), torch.Tensor) and attributes["_tr_loss"].dim() == 0
    assert attributes.get("_globalstep_last_logged") == 2
    assert isinstance(attributes.get("_total_loss_scalar"), float)


def loss_function_override(tmp_path: Path) -> None:
    from tests.tiny_models import tiny_causal_lm

    model = tiny_causal_lm()

    def mine(*args: Any, **kwargs: Any) -> None:
        return None

    model.loss_function = mine
    assert vars(model)["_loss_function"] is mine  # what flops.loss_shifts_labels reads


def torchmetrics_states(tmp_path: Path) -> None:
    torchmetrics = pytest.importorskip("torchmetrics")
    metric = torchmetrics.MeanMetric()
    assert set(metric._defaults) == {"mean_value", "weight"}


def mlflow_run_url_printer(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri="http://127.0.0.1:9")  # nothing is contacted here
    assert callable(client._tracking_client._log_url)
    assert list(inspect.signature(client._tracking_client._log_url).parameters) == ["run_id"]


def mlflow_store_registry(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    with pytest.raises(Exception) as unknown:
        _tracking_store_registry.get_store_builder("ftp://host/x")
    assert "http" in unknown.value.supported_uri_schemes
    assert callable(_tracking_store_registry.get_store_builder("databricks"))


def tensorboard_file_writer(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path))
    try:
        assert hasattr(writer._get_file_writer(), "add_event")
    finally:
        writer.close()


def fsdp1_handle_and_local_shard(tmp_path: Path) -> None:
    # an FSDP1 wrapper's FlatParamHandle, and its flat parameter's local shard (built without a
    # process group: read from the source that sets them)
    from torch.distributed.fsdp import _flat_param, _init_utils

    assert "state._handle = handle" in inspect.getsource(_init_utils._init_param_handle_from_params)
    assert "flat_param._local_shard = " in inspect.getsource(_flat_param.FlatParamHandle)


def module_non_persistent_buffers(tmp_path: Path) -> None:
    import torch

    module = torch.nn.Module()
    module.register_buffer("scratch", torch.zeros(1), persistent=False)
    assert module._non_persistent_buffers_set == {"scratch"}


def zero3_unflatten(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    unflatten = DeepSpeedZeroOptimizer_Stage3._unflatten_partitioned_parameters
    assert list(inspect.signature(unflatten).parameters) == ["self", "sub_group_id"]


def cpu_attention_kernels(tmp_path: Path) -> None:
    import torch

    for name in ("_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention_for_cpu_backward"):
        assert hasattr(torch.ops.aten, name), name


def fsdp1_flat_parameter_metadata(tmp_path: Path) -> None:
    """What flops.full_weights reads of FSDP1: the wrapper's handle, and each flat parameter's
    original parameters (their modules and names, shapes, tied duplicates, the parameters
    themselves with ``use_orig_params=True``)."""
    import torch.distributed.fsdp._flat_param as flat_param
    from torch.distributed.fsdp import FullyShardedDataParallel

    declared = flat_param.FlatParameter.__annotations__
    assert {"_param_infos", "_shapes", "_shared_param_infos", "_params"} <= set(declared)
    assert set(flat_param.ParamInfo._fields) >= {"param_name", "module"}
    shared_fields = {"param_name", "module", "prim_param_name", "prim_module"}
    assert set(flat_param.SharedParamInfo._fields) >= shared_fields
    assert "self._handle" in inspect.getsource(FullyShardedDataParallel._flat_param.fget)


def gradient_checkpointing_function(tmp_path: Path) -> None:
    """What flops.reentrant_checkpointing reads: the checkpoint function transformers puts on each
    checkpointed module, a partial holding ``use_reentrant``."""
    from tests.callbacks.test_flops import llama

    model = llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    functions = [m._gradient_checkpointing_func for m in model.modules()
                 if getattr(m, "gradient_checkpointing", False)]
    assert functions and all(f.keywords == {"use_reentrant": True} for f in functions)


def clip_and_grad_norm(tmp_path: Path) -> None:
    """TrainerPlusMixin overrides both: transformers clips (when max_grad_norm > 0), then reads the norm,
    then fires on_pre_optimizer_step."""
    from transformers import Trainer

    source = inspect.getsource(Trainer._inner_training_loop) + inspect.getsource(Trainer._run_epoch)
    clip, norm = source.index("self._clip_grad_norm(model)"), source.index("self._get_grad_norm(model")
    assert clip < norm < source.index("on_pre_optimizer_step")


def health_torch(tmp_path: Path) -> None:
    """What callbacks/health reads of torch: the multi-tensor norm with a dtype, and CUDA's memory
    history and snapshot (Python functions in every build; the out-of-memory observer exists in CUDA
    builds only, and is looked up with getattr)."""
    import torch

    norms = torch._foreach_norm([torch.ones(4, dtype=torch.bfloat16)], 2, dtype=torch.float32)
    assert norms[0].dtype == torch.float32 and float(norms[0]) == 2.0
    assert callable(torch.cuda.memory._record_memory_history) and callable(torch.cuda.memory._dump_snapshot)
    assert hasattr(torch, "_C")
    if torch.cuda.is_available():
        assert callable(torch._C._cuda_attach_out_of_memory_observer)


def health_fsdp1_shards(tmp_path: Path) -> None:
    """runtime/engines.local_segments: each original parameter's slice of an FSDP1 local shard."""
    from torch.distributed.fsdp._flat_param import FlatParameter, _ShardParamInfo

    assert {"_fqns", "_shard_param_infos"} <= set(FlatParameter.__annotations__)
    assert {"in_shard", "offset_in_shard", "numel_in_shard"} <= set(_ShardParamInfo._fields)


def health_accelerate_overflow(tmp_path: Path) -> None:
    from accelerate.optimizer import AcceleratedOptimizer

    assert "_is_overflow" in inspect.getsource(AcceleratedOptimizer.step_was_skipped.fget)


def health_deepspeed(tmp_path: Path) -> None:
    """ZeRO's pre-clip norm, set before the update calls, and each parameter's fragment of the masters."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    stage3 = DeepSpeedZeroOptimizer_Stage3.step
    stage3 = next((c.cell_contents for c in stage3.__closure__ or () if callable(c.cell_contents)), stage3)
    for step in (DeepSpeedZeroOptimizer.step, stage3):  # stage 3's is wrapped for NVTX
        source = inspect.getsource(step)
        assert source.index("self._global_grad_norm =") < source.index("_optimizer_step(")
    import importlib

    fragments = importlib.import_module("deepspeed.utils.tensor_fragment")
    assert "_hp_mapping" in inspect.getsource(DeepSpeedZeroOptimizer._create_param_mapping)
    assert "def get_hp_fragment_address" in inspect.getsource(fragments.tensor_fragment)


def foreach_updates(tmp_path: Path) -> None:
    # the fused updates of WeightAveraging: lists of tensors, a float weight, in place
    import torch

    average, weights, origin = [torch.zeros(3)], [torch.ones(3)], [torch.full((3,), 0.5)]
    torch._foreach_lerp_(average, weights, 0.25)
    assert torch.equal(average[0], torch.full((3,), 0.25))
    out = [torch.empty(3)]
    torch._foreach_copy_(out, weights)
    torch._foreach_sub_(out, origin)
    torch._foreach_mul_(out, 2.0)
    torch._foreach_add_(out, average)
    assert torch.equal(out[0], torch.full((3,), 1.25))


#: (library, owner, private name, who relies on it and for what, check). One row per name.
TABLE: list[tuple[str, str, str, str, Callable[[Path], None]]] = [
    ("transformers", "Trainer", "_eval_dataloaders",
     "runtime/isolated_evaluation.py: hidden while the subset's loader is built", eval_loader_cache),
    ("transformers", "Seq2SeqTrainer", "_gen_kwargs",
     "runtime/isolated_evaluation.py: put back after the subset's evaluate", seq2seq_generation_settings),
    ("transformers", "Trainer", "_maybe_log_save_evaluate",
     "integrations/transformers.py: TrainerPlusMixin overrides it (loop_context)", loop_log_save_evaluate),
    ("transformers", "Trainer", "_clip_grad_norm",
     "integrations/transformers.py: TrainerPlusMixin fires on_pre_clip before transformers clips",
     clip_and_grad_norm),
    ("transformers", "Trainer", "_get_grad_norm",
     "integrations/transformers.py: TrainerPlusMixin keeps the norm before clipping (pre_clip_grad_norm)",
     clip_and_grad_norm),
    ("transformers", "Trainer", "_load_from_checkpoint",
     "integrations/transformers.py: a vetoed resume loads the weights", load_from_checkpoint),
    ("transformers", "Trainer", "_tr_loss",
     "callbacks/deadline/window.py: the running loss carried through a stop's checkpoint; "
     "callbacks/health: each step's loss (its growth since on_step_begin)", logging_window),
    ("transformers", "Trainer", "_globalstep_last_logged",
     "callbacks/deadline/window.py: where the carried logging window starts", logging_window),
    ("transformers", "Trainer", "_total_loss_scalar",
     "callbacks/deadline/window.py: train_loss of a resumed train() counts its own steps", logging_window),
    ("transformers", "PreTrainedModel", "_loss_function",
     "callbacks/throughput/flops.py: a user's loss_function decides the loss tokens", loss_function_override),
    ("trl", "SFTTrainer, DPOTrainer, RewardTrainer, GRPOTrainer, RLOOTrainer", "_metrics",
     "runtime/isolated_evaluation.py: set aside during the subset's evaluation; "
     "callbacks/deadline/window.py: carried through a stop's checkpoint", trl_metrics_instance),
    ("trl", "GRPOTrainer, RLOOTrainer", "_logs",
     "runtime/isolated_evaluation.py: set aside during the subset's evaluation",
     trl_accumulators(("_logs", "_metrics", "log_completions"), ("GRPOTrainer", "RLOOTrainer"))),
    ("trl", "GRPOTrainer", "_pending_metrics",
     "runtime/isolated_evaluation.py: set aside during the subset's evaluation",
     trl_accumulators(("_pending_metrics", "_pending_extra_logs"), ("GRPOTrainer",))),
    ("trl", "GRPOTrainer", "_pending_extra_logs",
     "runtime/isolated_evaluation.py: set aside during the subset's evaluation",
     trl_accumulators(("_pending_extra_logs",), ("GRPOTrainer",))),
    ("torchmetrics", "Metric", "_defaults",
     "metrics/streaming.py: the states to align across ranks", torchmetrics_states),
    ("mlflow", "MlflowClient._tracking_client", "_tracking_client",
     "loggers/mlflow.py: the run URL is printed with credentials masked", mlflow_run_url_printer),
    ("mlflow", "TrackingServiceClient", "_log_url",
     "loggers/mlflow.py: the run URL is printed with credentials masked", mlflow_run_url_printer),
    ("mlflow", "mlflow.tracking._tracking_service.utils", "_tracking_store_registry",
     "loggers/mlflow.py: a tracking URI's scheme is one MLflow (or a plugin) has a store for",
     mlflow_store_registry),
    ("mlflow", "mlflow.store.db.utils", "_all_tables_exist",
     "loggers/mlflow_helper.py: whether a store has its tables (opening it then runs no migration)",
     mlflow_store_creation),
    ("mlflow", "mlflow.store.db.utils", "_is_empty_database",
     "loggers/mlflow_helper.py: an empty database is given its tables at once", mlflow_store_creation),
    ("mlflow", "mlflow.store.db.utils", "_safe_initialize_tables",
     "loggers/mlflow_helper.py: a store's tables made under MLflow's own lock", mlflow_store_creation),
    ("torch", "SummaryWriter", "_get_file_writer",
     "loggers/tensorboard.py: one event per record", tensorboard_file_writer),
    ("torch", "FullyShardedDataParallel", "_handle",
     "runtime/engines.py: FSDP1's flat parameters (this rank's part of the weights)",
     fsdp1_handle_and_local_shard),
    ("torch", "FlatParameter", "_local_shard",
     "runtime/engines.py: this rank's shard of an FSDP1 flat parameter, copied and put back",
     fsdp1_handle_and_local_shard),
    ("torch", "Module", "_non_persistent_buffers_set",
     "runtime/engines.py: the persistent buffers restore_best keeps", module_non_persistent_buffers),
    ("deepspeed", "DeepSpeedZeroOptimizer_Stage3", "_unflatten_partitioned_parameters",
     "runtime/engines.py: the restored masters into ZeRO-3's partitioned parameters, as DeepSpeed's "
     "own checkpoint load", zero3_unflatten),
    ("transformers", "PreTrainedModel's checkpointed modules", "_gradient_checkpointing_func",
     "callbacks/throughput/flops.py: measure is refused with reentrant checkpointing",
     gradient_checkpointing_function),
    ("torch", "FullyShardedDataParallel", "_handle",
     "callbacks/throughput/flops.py: FSDP1's flat parameters (FLOPs)", fsdp1_flat_parameter_metadata),
    ("torch", "FlatParameter", "_param_infos",
     "callbacks/throughput/flops.py: FSDP1's original parameters (FLOPs)", fsdp1_flat_parameter_metadata),
    ("torch", "FlatParameter", "_shapes",
     "callbacks/throughput/flops.py: FSDP1's original shapes (FLOPs)", fsdp1_flat_parameter_metadata),
    ("torch", "FlatParameter", "_shared_param_infos",
     "callbacks/throughput/flops.py: FSDP1's tied weights, counted once", fsdp1_flat_parameter_metadata),
    ("torch", "FlatParameter", "_params",
     "callbacks/throughput/flops.py: FSDP1's trained and frozen weights", fsdp1_flat_parameter_metadata),
    ("torch", "torch.ops.aten", "_scaled_dot_product_flash_attention_for_cpu",
     "callbacks/throughput/flops.py: FLOPs of CPU attention", cpu_attention_kernels),
    ("torch", "torch.ops.aten", "_scaled_dot_product_flash_attention_for_cpu_backward",
     "callbacks/throughput/flops.py: FLOPs of CPU attention", cpu_attention_kernels),
    ("torch", "torch", "_foreach_norm",
     "callbacks/health: per-layer and total gradient norms in one kernel per tensor list", health_torch),
    ("torch", "torch", "_C", "callbacks/health/memory.py: the CUDA out-of-memory observer", health_torch),
    ("torch", "torch._C", "_cuda_attach_out_of_memory_observer",
     "callbacks/health/memory.py: the snapshot written when CUDA runs out of memory", health_torch),
    ("torch", "torch.cuda.memory", "_record_memory_history",
     "callbacks/health/memory.py: the allocation history of the out-of-memory snapshot", health_torch),
    ("torch", "torch.cuda.memory", "_dump_snapshot",
     "callbacks/health/memory.py: the out-of-memory snapshot", health_torch),
    ("torch", "FlatParameter", "_fqns", "runtime/engines.py: local_segments (per-layer norms under FSDP1)",
     health_fsdp1_shards),
    ("torch", "FlatParameter", "_shard_param_infos",
     "runtime/engines.py: local_segments (per-layer norms under FSDP1)", health_fsdp1_shards),
    ("accelerate", "AcceleratedOptimizer", "_is_overflow",
     "callbacks/health/hooks.py: a skipped step reads as skipped (step_was_skipped)",
     health_accelerate_overflow),
    ("deepspeed", "DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3", "_global_grad_norm",
     "callbacks/health/hooks.py: ZeRO's gradient norm before clipping, read before the update",
     health_deepspeed),
    ("deepspeed", "ZeRO-1/2 parameters", "_hp_mapping",
     "runtime/engines.py: local_segments (each parameter's fragment of the master partition)",
     health_deepspeed),
    ("torch", "torch", "_foreach_lerp_",
     "callbacks/weight_averaging/shard.py: the average's update, fused over the shard", foreach_updates),
    ("torch", "torch", "_foreach_copy_",
     "callbacks/weight_averaging/shard.py: the burn-in's copy and BEMA's correction", foreach_updates),
    ("torch", "torch", "_foreach_sub_",
     "callbacks/weight_averaging/shard.py: BEMA's correction", foreach_updates),
    ("torch", "torch", "_foreach_mul_",
     "callbacks/weight_averaging/shard.py: BEMA's correction", foreach_updates),
    ("torch", "torch", "_foreach_add_",
     "callbacks/weight_averaging/shard.py: BEMA's correction", foreach_updates),
]

#: Names in ``TRAINER_ACCUMULATORS`` for releases older than the installed ones: nothing installed
#: has them to check (``trl < 0.20``'s ``_stored_metrics``).
LEGACY = {"_stored_metrics": "trl < 0.20 (DPOTrainer, KTOTrainer)"}

#: Private names the package sets on other objects itself (its own marks).
OURS = {"_isolated_evaluation"}


@pytest.mark.transformers
@pytest.mark.parametrize("row", TABLE, ids=[f"{row[0]}.{row[2]}" for row in TABLE])
def test_each_private_name_exists_in_the_installed_release(row, tmp_path):
    library, owner, name, used_by, check = row
    check(tmp_path)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _names_in_package() -> tuple[dict[str, list[str]], set[str]]:
    """(private names used: where, private names the package defines itself)."""
    used: dict[str, list[str]] = {}
    defined: set[str] = set()
    for path in sorted((ROOT / "hf_callbacks_plus").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and _private(node.name):
                defined.add(node.name)
            if isinstance(node, ast.ClassDef):  # class attributes
                for statement in node.body:
                    targets = (statement.targets if isinstance(statement, ast.Assign)
                               else [statement.target] if isinstance(statement, ast.AnnAssign) else [])
                    defined.update(t.id for t in targets if isinstance(t, ast.Name) and _private(t.id))
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):  # self._x = ...
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    defined.update(e.attr for e in ast.walk(target) if isinstance(e, ast.Attribute)
                                   and _private(e.attr) and isinstance(e.value, ast.Name)
                                   and e.value.id in ("self", "cls"))
            name = None
            if isinstance(node, ast.ImportFrom) and not node.level:  # from library import _name
                used.update({alias.name: used.get(alias.name, []) + [f"{where}:{node.lineno}"]
                             for alias in node.names if _private(alias.name)})
            if isinstance(node, ast.Attribute) and _private(node.attr):
                name = node.attr
            elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr", "setattr", "delattr"):
                key = node.args[1]
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and _private(key.value):
                    name = key.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                    and node.func.attr in ("get", "pop", "setdefault"):
                owner = node.func.value
                if (isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "vars") or \
                        (isinstance(owner, ast.Attribute) and owner.attr == "__dict__"):
                    key = node.args[0]
                    if isinstance(key, ast.Constant) and isinstance(key.value, str) and _private(key.value):
                        name = key.value
            if name is not None:
                used.setdefault(name, []).append(f"{where}:{node.lineno}")
    return used, defined


def test_the_table_names_every_private_name_the_package_uses():
    from hf_callbacks_plus.runtime.isolated_evaluation import TRAINER_ACCUMULATORS

    used, defined = _names_in_package()
    listed = {row[2] for row in TABLE}
    unlisted = {name: where for name, where in used.items()
                if name not in defined and name not in listed and name not in OURS}
    assert unlisted == {}, "add a row to TABLE (and to docs/versions.md) for each"
    assert set(TRAINER_ACCUMULATORS) <= listed | set(LEGACY)
    overridden = {"_maybe_log_save_evaluate", "_clip_grad_norm", "_get_grad_norm"}  # TrainerPlusMixin's own
    stale = {row[2] for row in TABLE} - set(used) - set(TRAINER_ACCUMULATORS) - overridden
    assert stale == set(), "the package no longer uses these: drop their rows"


def test_the_docs_list_every_row():
    page = (ROOT / "docs" / "versions.md").read_text(encoding="utf-8")
    section = page[page.index("## Private names we rely on"):]
    missing = [name for name in {row[2] for row in TABLE} | set(LEGACY) if f"`{name}`" not in section]
    assert missing == []


def test_no_frame_inspection_in_the_package():
    """What a call passes is recorded where it passes, never read from a caller's frame."""
    frames = ("_getframe", "currentframe", "f_back", "f_locals")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / "hf_callbacks_plus").rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if any(word in line for word in frames)]
    assert found == []
