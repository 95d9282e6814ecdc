"""KeepBestCheckpoints under DeepSpeed ZeRO-1/2/3 and FSDP (FSDP2, FSDP1; full and sharded state
dicts), through a stock Trainer, TrainerPlus and trl's SFTTrainer with LoRA, on 2 real ranks
(issue 31).

One run per engine keeps the 2 best saves by training loss twice over (``save_total_limit=1``,
so rotation deletes the checkpoints): the model only, and ``resumable=True``. Against the
engine's own layout (``tests/test_sharded_engines.py``'s ``LAYOUT``), independently of the
package's file table:

* the model-only folder holds the model's weights once, in the form the trainer wrote
  (consolidated, or the engine's shards: FSDP's ``pytorch_model_fsdp_0/``, ZeRO-3's fp32 master
  partitions without the optimizer's moments), the metadata and the state, never an optimizer
  state; the weights it holds are the weights the model had at that save (gathered then), read
  back with the engine's own tools (``zero_to_fp32``, torch's distributed checkpoint);
* the resumable folder holds exactly the files the engine's resume reads, and resuming from it
  (in a fresh ``output_dir``) ends with the uninterrupted run's weights, bit for bit;
* each rank copied only the files it wrote (its ZeRO partition, its shard, its RNG state);
* a rank that cannot copy its files fails the keep on every rank: the previous best stays.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.sharded import DEEPSPEED_STAGES, FSDP_ENGINES, TRAINERS, engine_scenarios

pytestmark = [pytest.mark.transformers, pytest.mark.slow]
pytest.importorskip("deepspeed")
pytest.importorskip("trl")

STEPS, SAVE_STEPS = 4, 2
MODEL, RESUMABLE, FAILING = "best_model", "best_resumable", "best_failing"
METADATA = {"config.json", "generation_config.json", "training_args.bin", "tokenizer.json",
            "tokenizer_config.json"}


def digest(tensor) -> str:
    return hashlib.sha256(tensor.detach().float().contiguous().numpy().tobytes()).hexdigest()[:16]


def keeps(out: Path, engine: str, trainer: str = "trainer") -> None:
    """Train under ``engine`` keeping the 2 best by loss (model only, and resumable); record the
    weights at each save and who copied what; resume a fresh run from the resumable kept folder
    of the earliest kept step."""
    import os
    import shutil

    from transformers import TrainerCallback

    from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
    from hf_callbacks_plus.callbacks.best_checkpoints import files as kept_files
    from tests import sharded

    rank = int(os.environ["RANK"])
    copied: list[str] = []  # the files this rank wrote into kept folders (a spy, not a fault)
    originals = {name: getattr(kept_files, name) for name in ("copy_file", "_weights_only")}

    def spying(name):
        def copy(source, target):
            if rank == 1 and f"{FAILING}/.building-checkpoint-{STEPS}/" in target:  # a fault injected
                raise OSError(28, "No space left on device (injected on rank 1)", target)
            copied.append(target.split(".building-", 1)[1].split("/", 1)[1])
            return originals[name](source, target)
        return copy

    class WeightsAtSave(TrainerCallback):
        """The whole weights at every save (a collective on both ranks)."""

        def __init__(self):
            self.trainer, self.digests, self.adapter_tensors = None, {}, {}

        def on_save(self, args, state, control, **kwargs):
            weights = sharded.full_weights(self.trainer)
            self.digests[state.global_step] = {name: digest(value) for name, value in weights.items()}
            adapter = out / "run" / f"checkpoint-{state.global_step}" / "adapter_model.safetensors"
            if rank == 0 and adapter.is_file():  # what the trainer itself wrote of the adapter
                from safetensors import safe_open

                with safe_open(str(adapter), framework="pt") as handle:
                    self.adapter_tensors[state.global_step] = len(list(handle.keys()))

    class ReferenceCopy(TrainerCallback):
        """FSDP1's own resume does not reproduce the uninterrupted run on CPU (from its own
        checkpoint-N either: its optimizer state comes back slightly off), so there the reference is
        a resume from the trainer's checkpoint, copied before rotation deletes it."""

        def on_save(self, args, state, control, **kwargs):
            if rank == 0:
                shutil.copytree(out / "run" / f"checkpoint-{state.global_step}",
                                out / "reference" / f"checkpoint-{state.global_step}")

    model_only = KeepBestCheckpoints("loss", k=2, mode="min", dirname=MODEL, verbose=False)
    resumable = KeepBestCheckpoints("loss", k=2, mode="min", dirname=RESUMABLE, resumable=True, verbose=False)
    failing = KeepBestCheckpoints("loss", k=1, mode="min", dirname=FAILING, resumable=True, verbose=False)
    at_save = WeightsAtSave()
    # TrainerPlus without a save limit (the kept folders are copied while their checkpoint-N stay)
    limit = None if trainer == "trainer_plus" else 1
    args = {"max_steps": STEPS, "save_strategy": "steps", "save_steps": SAVE_STEPS, "save_total_limit": limit}
    for name in originals:
        setattr(kept_files, name, spying(name))
    try:
        with sharded.sharded_on_cpu():
            run = sharded.make_trainer(engine, out / "run", trainer=trainer,
                                       callbacks=[model_only, resumable, failing, at_save,
                                                  *([ReferenceCopy()] if engine.startswith("fsdp1") else [])],
                                       **args)
            at_save.trainer = run
            run.train()
            final = {name: digest(value) for name, value in sharded.full_weights(run).items()}
    finally:
        for name, original in originals.items():
            setattr(kept_files, name, original)
    kept = [entry.step for entry in resumable.entries]
    start = min(kept)
    with sharded.sharded_on_cpu():
        resumed = sharded.make_trainer(engine, out / "resumed", trainer=trainer, **args)
        resumed.train(resume_from_checkpoint=str(out / "run" / RESUMABLE / f"checkpoint-{start}"))
        after_resume = {name: digest(value) for name, value in sharded.full_weights(resumed).items()}
    reference = final
    if engine.startswith("fsdp1"):
        with sharded.sharded_on_cpu():
            again = sharded.make_trainer(engine, out / "again", trainer=trainer, **args)
            again.train(resume_from_checkpoint=str(out / "reference" / f"checkpoint-{start}"))
            reference = {name: digest(value) for name, value in sharded.full_weights(again).items()}
    sharded.write_json(out, {
        "kept": {MODEL: [entry.step for entry in model_only.entries], RESUMABLE: kept},
        "at_save": at_save.digests, "adapter_tensors": at_save.adapter_tensors, "reference": reference,
        "after_resume": after_resume,
        "copied": sorted(copied), "rank": rank, "losses": {r["step"]: r["loss"] for r in run.state.log_history
                                                           if "loss" in r},
        "failing": {"kept": [entry.step for entry in failing.entries], "not_kept": failing.not_kept,
                    "folders": sorted(path.name for path in (out / "run" / FAILING).iterdir())},
        "files": {dirname: {str(step): sharded.checkpoint_files(out / "run" / dirname / f"checkpoint-{step}")
                            for step in kept} for dirname in (MODEL, RESUMABLE)},
        "checkpoint": sharded.checkpoint_files(out / "run" / f"checkpoint-{STEPS}"),
    })


def layout(engine: str, step: int) -> dict[str, set[str]]:
    """What the engine writes into checkpoint-<step> (the stock Trainer's), by part: the
    consolidated weights, the engine's weights, what only a resume reads, the rest."""
    ranks = ("0", "1")
    parts = {"state": {"trainer_state.json"}, "metadata": set(METADATA), "weights": {"model.safetensors"},
             "engine": set(), "resume": {"scheduler.pt", *(f"rng_state_{r}.pth" for r in ranks)}}
    if engine == "ddp":
        parts["resume"].add("optimizer.pt")
    elif engine in DEEPSPEED_STAGES:
        zero = f"global_step{step}"
        parts["engine"] = {"latest", "zero_to_fp32.py", "zero_to_torch.py"}
        optimizer = {f"{zero}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in ranks}
        if engine == "zero3":
            parts["weights"] = set()  # no 16-bit gathering: the weights are in the optimizer files only
            parts["engine"] |= {f"{zero}/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in ranks}
        else:
            parts["engine"].add(f"{zero}/mp_rank_00_model_states.pt")
        parts["resume"] |= optimizer
        parts["engine optimizer"] = optimizer
    elif FSDP_ENGINES[engine][1] == "FULL_STATE_DICT":
        parts["engine"] = {"pytorch_model_fsdp.bin"}
        parts["resume"].add("optimizer.bin")
    else:
        parts["weights"], parts["metadata"] = set(), set()
        shards = (".metadata", "__0_0.distcp", "__1_0.distcp")
        parts["engine"] = {f"pytorch_model_fsdp_0/{name}" for name in shards}
        parts["resume"] |= {f"optimizer_0/{name}" for name in shards}
    return parts


def expected_files(engine: str, step: int) -> tuple[set[str], set[str]]:
    """(model only, resumable) by the rules of the docs, from the engine's layout."""
    parts = layout(engine, step)
    always = parts["state"] | parts["metadata"]
    if parts["weights"]:
        model_only = always | parts["weights"]
    elif engine == "zero3":  # the fp32 master partitions (weights only), and what zero_to_fp32 reads besides
        model_only = always | parts["engine"] | parts["engine optimizer"]
    else:
        model_only = always | parts["engine"]
    weights_for_resume = parts["engine"] or parts["weights"]  # an engine resumes from its own
    return model_only, always | weights_for_resume | parts["resume"]


def owner(path: str) -> int:
    return 1 if any(mark in path for mark in ("rank_1_", "__1_0", "rng_state_1")) else 0


def check_keeps(outcome, engine: str, trainer: str) -> None:
    from tests.sharded import saved_weights

    ranks = outcome.json()
    first = ranks[0]
    assert ranks[1]["kept"] == first["kept"] and len(first["kept"][MODEL]) == 2
    assert first["kept"][MODEL] == first["kept"][RESUMABLE]
    if trainer == "trainer":  # the engine's layout as this test states it
        assert set(first["checkpoint"]) == set().union(*layout(engine, STEPS).values())
    for step in first["kept"][RESUMABLE]:
        model_only, resumable = (set(first["files"][name][str(step)]) for name in (MODEL, RESUMABLE))
        if trainer == "trainer":
            assert (model_only, resumable) == expected_files(engine, step), step
        kept = outcome.dir / "run" / MODEL / f"checkpoint-{step}"
        if trainer != "sft_lora":  # the weights of that save, read back with the engine's own tools
            saved = saved_weights(kept)
            assert {name: digest(value) for name, value in saved.items()} == first["at_save"][str(step)], step
        elif "adapter_model.safetensors" in first["checkpoint"]:  # the adapter only, as peft saved it
            from safetensors.torch import load_file

            assert model_only == {"adapter_model.safetensors", "adapter_config.json", "README.md",
                                  "trainer_state.json", "training_args.bin", "tokenizer.json",
                                  "tokenizer_config.json"}, step
            adapter = load_file(kept / "adapter_model.safetensors")
            assert len(adapter) == first["adapter_tensors"][str(step)]  # FSDP1 on CPU: the trainer wrote none
            if adapter:
                assert {name: digest(value) for name, value in adapter.items()} == {
                    name.replace(".default.weight", ".weight"): value
                    for name, value in first["at_save"][str(step)].items() if "lora_" in name}, step
        assert not any("optimizer" in name and "optim_states" not in name for name in model_only)
        if engine == "zero3" and trainer == "trainer":  # the partitions hold no optimizer moments
            import torch

            for name in model_only:
                if name.endswith("optim_states.pt"):
                    state = torch.load(kept / name, map_location="cpu", weights_only=False)
                    assert "optimizer_state_dict" not in state["optimizer_state_dict"]
                    assert (kept / name).stat().st_size < first["files"][RESUMABLE][str(step)][name]
    # resuming from a kept folder ends where the uninterrupted run ended (FSDP1: where resuming from
    # the trainer's own checkpoint ends)
    assert first["after_resume"] == first["reference"]
    # rank 1 could not copy its files of the new best: no rank keeps it, the previous best stays
    losses = {int(step): loss for step, loss in first["losses"].items()}
    assert losses[STEPS] < losses[SAVE_STEPS]  # the last save is the new best
    for got in ranks:
        assert got["failing"]["kept"] == [SAVE_STEPS]
        assert [entry["step"] for entry in got["failing"]["not_kept"]] == [STEPS]
    assert "rank(s) [1] could not copy their files" in first["failing"]["not_kept"][0]["reason"]
    assert first["failing"]["folders"] == [f"checkpoint-{SAVE_STEPS}", "manifest.json"]
    # each rank copied only the files it wrote
    for got in ranks:
        assert got["copied"] and all(owner(path) == got["rank"] for path in got["copied"]), got["copied"]
    if engine != "ddp" or trainer == "trainer":
        assert any(owner(path) == 1 for path in ranks[1]["copied"])


FIRST_TIER = ("zero3", "fsdp2", "fsdp2_full")  # the reduced ZeRO-3 partitions, sharded and full FSDP


@pytest.mark.parametrize("engine", engine_scenarios(keeps, first_tier=FIRST_TIER))
def test_keeps_the_model_once_and_what_a_resume_reads_under_each_engine(engine, distributed_outcome):
    check_keeps(distributed_outcome, engine, "trainer")


@pytest.mark.parametrize(("engine", "trainer"),
                         [param for param in engine_scenarios(keeps, trainers=TRAINERS, first_tier=())
                          if param.values[1] != "trainer"])
@pytest.mark.second_tier
def test_every_trainer_under_every_engine(engine, trainer, distributed_outcome):
    check_keeps(distributed_outcome, engine, trainer)
