"""Which file of a checkpoint is what, per engine (core/checkpoint_files.py), on the layouts the
engines write (as ``tests/test_sharded_engines.py`` pins them on 2 ranks, and
``tests/callbacks/test_best_checkpoints_sharded.py`` checks on real runs): what a kept copy
holds, who copies each file, whether a folder can be resumed from."""

from __future__ import annotations

import json

import pytest

from hf_callbacks_plus.core.checkpoint_files import Kind, classify, kept_entries, owner, resume_problem
from tests.sharded import COMMON, DCP, METADATA, ZERO, ZERO3_MODEL
from tests.sharded import LAYOUT as SHARDED_LAYOUT

#: The layouts of tests/test_sharded_engines.py (checkpoint-4 of the stock Trainer, 2 ranks).
LAYOUT = {
    "ddp": SHARDED_LAYOUT["ddp"],
    "zero1": SHARDED_LAYOUT["zero1"],
    "zero3": SHARDED_LAYOUT["zero3"],
    "zero3, 16-bit gathered": SHARDED_LAYOUT["zero3"] | {"model.safetensors"},
    "fsdp sharded": SHARDED_LAYOUT["fsdp2"],
    "fsdp full": SHARDED_LAYOUT["fsdp2_full"],
    "zero3 lora": COMMON | ZERO | ZERO3_MODEL | {"adapter_model.safetensors", "adapter_config.json",
                                                 "README.md", "tokenizer.json", "tokenizer_config.json",
                                                 "training_args.bin"},
}
ALWAYS = {"trainer_state.json"} | METADATA
#: (model only, resumable): the docs' rules, written out per engine.
EXPECTED = {
    "ddp": (ALWAYS | {"model.safetensors"}, LAYOUT["ddp"]),
    "zero1": (ALWAYS | {"model.safetensors"}, LAYOUT["zero1"] - {"model.safetensors"}),
    "zero3": (ALWAYS | ZERO - {"global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                               "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt"} | ZERO3_MODEL
              | {"global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt",  # reduced to the weights
                 "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt"}, LAYOUT["zero3"]),
    "zero3, 16-bit gathered": (ALWAYS | {"model.safetensors"}, LAYOUT["zero3"]),
    "fsdp sharded": ({"trainer_state.json"} | DCP, LAYOUT["fsdp sharded"]),
    "fsdp full": (ALWAYS | {"model.safetensors"}, LAYOUT["fsdp full"] - {"model.safetensors"}),
    "zero3 lora": (LAYOUT["zero3 lora"] - ZERO - ZERO3_MODEL - COMMON | {"trainer_state.json"},
                   LAYOUT["zero3 lora"] - {"adapter_model.safetensors"}),
}


def make(tmp_path, files):
    for name in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"global_step": 4}) if name == "trainer_state.json" else
                        "global_step4" if name == "latest" else "x")
    return str(tmp_path)


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_a_kept_copy_holds_the_model_once_or_what_a_resume_reads(tmp_path, engine):
    folder = make(tmp_path, LAYOUT[engine])
    model_only, resumable = (kept_entries(folder, mode, world_size=2) for mode in (False, True))
    assert ({entry.path for entry in model_only}, {entry.path for entry in resumable}) == EXPECTED[engine]
    reduced = {entry.path for entry in model_only if entry.weights_only}
    assert reduced == ({path for path in ZERO if "optim_states" in path} if engine == "zero3" else set())
    assert not any(entry.weights_only for entry in resumable)
    # a model-only copy cannot be resumed from; a resumable one and the checkpoint itself can
    assert resume_problem(folder) is None
    for entries, problem in ((model_only, True), (resumable, False)):
        copy = make(tmp_path / ("copy-" + str(problem)), {entry.path for entry in entries})
        assert (resume_problem(copy) is not None) == problem, entries


@pytest.mark.parametrize(("path", "kind"), [
    ("model.safetensors", Kind.WEIGHTS), ("model-00001-of-00002.safetensors", Kind.WEIGHTS),
    ("pytorch_model.bin.index.json", Kind.WEIGHTS), ("adapter_model.safetensors", Kind.WEIGHTS),
    ("extra/adapter_model.safetensors", Kind.WEIGHTS), ("model_state.pkl", Kind.WEIGHTS),
    ("pytorch_model_fsdp.bin", Kind.ENGINE_WEIGHTS),
    ("pytorch_model_fsdp_0/__1_0.distcp", Kind.ENGINE_WEIGHTS),
    ("global_step4/mp_rank_00_model_states.pt", Kind.ENGINE_WEIGHTS),
    ("global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt", Kind.OPTIMIZER),
    ("optimizer_0/.metadata", Kind.OPTIMIZER), ("optimizer.pt", Kind.OPTIMIZER),
    ("optimizer.bin", Kind.OPTIMIZER), ("rng_state_1.pth", Kind.RESUME), ("scaler.pt", Kind.RESUME),
    ("best_weights-eval_loss.safetensors", Kind.RESUME),
    ("weight_average-ema.safetensors", Kind.AVERAGE), ("weight_average-bema-rank1.safetensors", Kind.AVERAGE),
    ("latest", Kind.ENGINE_INDEX), ("zero_to_fp32.py", Kind.ENGINE_INDEX), ("trainer_state.json", Kind.STATE),
    ("config.json", Kind.METADATA), ("training_args.bin", Kind.METADATA),
    ("special_tokens_map.json", Kind.METADATA),
])
def test_classify(path, kind):
    assert classify(path) == kind


@pytest.mark.parametrize(("path", "world", "rank"), [
    ("rng_state_1.pth", 2, 1), ("rng_state_1.pth", 1, 0), ("rng_state.pth", 2, 0),
    ("global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt", 2, 1),
    ("global_step4/mp_rank_00_model_states.pt", 2, 0), ("pytorch_model_fsdp_0/__1_0.distcp", 2, 1),
    ("pytorch_model_fsdp_0/.metadata", 2, 0), ("model.safetensors", 2, 0),
    ("best_weights-eval_loss-rank1.safetensors", 2, 1), ("best_weights-eval_loss.safetensors", 2, 0),
    ("weight_average-ema-rank1.safetensors", 2, 1), ("weight_average-ema.safetensors", 2, 0),
])
def test_each_file_is_copied_by_the_rank_that_wrote_it(path, world, rank):
    assert owner(path, world) == rank


def test_resume_problems_name_what_is_missing(tmp_path):
    assert "no trainer_state.json" in resume_problem(make(tmp_path / "a", {"model.safetensors"}))
    assert "no RNG state" in resume_problem(make(tmp_path / "b", {"model.safetensors", "trainer_state.json"}))
    plain = {"model.safetensors", "trainer_state.json", "rng_state.pth"}
    assert "no optimizer state" in resume_problem(make(tmp_path / "e", plain))
    zero = make(tmp_path / "c", LAYOUT["zero3"] - {"global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt",
                                                  "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"})
    assert "lacks its model or optimizer states" in resume_problem(zero)
    sharded = {"trainer_state.json", "rng_state_0.pth"} | DCP
    assert "no FSDP optimizer state" in resume_problem(make(tmp_path / "d", sharded))


@pytest.mark.parametrize("resumable", [False, True])
def test_the_average_is_kept_with_every_copy(tmp_path, resumable):
    """WeightAveraging's files (each rank's under an engine) go with a model-only copy too: the
    weights a ranking on the averaged evaluation refers to."""
    averages = {"weight_average-ema-rank0.safetensors", "weight_average-ema-rank1.safetensors"}
    folder = make(tmp_path / "c", {"trainer_state.json", "model.safetensors", "optimizer.pt",
                                   "rng_state_0.pth",
                                   *averages})
    kept = {entry.path: entry.owner for entry in kept_entries(folder, resumable, world_size=2)}
    assert {path: kept[path] for path in averages} == {path: int(path[-13]) for path in averages}
