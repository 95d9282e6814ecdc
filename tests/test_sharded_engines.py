"""The sharded-engine harness (tests/sharded.py) is real, and the ground truth for callbacks under it.

For each engine, on the 2 ranks of the suite's launch, a stock ``transformers.Trainer`` (and, in
the second tier, ``TrainerPlus`` and trl's ``SFTTrainer`` with LoRA) trains the tiny Llama twice:
without callbacks and with a do-nothing ``TrainerCallback``. The tests check that

* the sharding is real: ZeRO-3 parameters are ``numel() == 0`` placeholders with ``ds_numel``
  and this rank's ``ds_tensor`` partition; FSDP2 parameters are DTensors ``Shard(0)`` with half
  the rows on each rank; FSDP1 holds 1-D flat shards; ZeRO-1/2 and DDP hold full parameters;
* the trainer's own records (loss, grad_norm, eval_loss, learning_rate in ``log_history``) and
  the trained weights are bit-identical with and without the callback (what a real callback
  must keep too), and the same on both ranks;
* ``full_weights`` gathers the whole model: the same names and shapes as the unsharded model,
  equal on both ranks, and close to the DDP reference run's weights (the engines reduce in
  different orders, so not bit-equal);
* each engine's ``checkpoint-N`` holds the files listed in ``LAYOUT`` (what a checkpoint
  keeper must understand: which files hold the weights, which only a resume needs).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.sharded import DEEPSPEED_STAGES, FSDP_ENGINES, LAYOUT, TRAINERS, engine_scenarios, saved_weights

pytestmark = [pytest.mark.transformers, pytest.mark.slow]
pytest.importorskip("deepspeed")
pytest.importorskip("trl")

STEPS, SAVE_STEPS = 4, 4
WEIGHTS = {
    "ddp": {"model.safetensors"},
    # ZeRO-1/2: the fp32 module state again in mp_rank_00_model_states.pt (the optimizer shards hold
    # the fp32 master copy too)
    "zero1": {"model.safetensors", "global_step4/mp_rank_00_model_states.pt"},
    # ZeRO-3 without stage3_gather_16bit_weights_on_model_save: only in the optimizer shards
    # (zero_to_fp32.py reads them; the *_model_states.pt hold no weights)
    "zero3": {"global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt",
              "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt"},
    "fsdp2": {"pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp_0/__0_0.distcp",
              "pytorch_model_fsdp_0/__1_0.distcp"},
    "fsdp2_full": {"model.safetensors", "pytorch_model_fsdp.bin"},
}
WEIGHTS["zero2"] = WEIGHTS["zero1"]
WEIGHTS["fsdp1_sharded"] = WEIGHTS["fsdp2"]
WEIGHTS["fsdp1_full"] = WEIGHTS["fsdp2_full"]


def digest(tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()[:16]


def baseline(out: Path, engine: str, trainer: str = "trainer") -> None:
    """Train twice under ``engine`` (without callbacks, then with a do-nothing callback), saving
    at the last step; write each run's records and weights, and the second run's sharding."""
    from transformers import TrainerCallback

    from tests import sharded

    class DoNothing(TrainerCallback):
        """Overrides every event and does nothing."""

    for event in [name for name in dir(TrainerCallback) if name.startswith("on_")]:
        setattr(DoNothing, event, lambda self, args, state, control, **kwargs: None)

    outcome = {}
    with sharded.sharded_on_cpu():
        for name, callbacks in (("without", []), ("with", [DoNothing()])):
            run = sharded.make_trainer(engine, out / name, trainer=trainer, callbacks=callbacks,
                                       max_steps=STEPS, eval_strategy="steps", eval_steps=2,
                                       save_strategy="steps", save_steps=SAVE_STEPS)
            run.train()
            weights = sharded.full_weights(run)
            outcome[name] = {
                "records": sharded.records(run),
                "weights": {key: {"shape": list(value.shape), "digest": digest(value)}
                            for key, value in weights.items()},
                "sums": {key: float(value.double().sum()) for key, value in weights.items()},
                "checkpoint": sharded.checkpoint_files(out / name / f"checkpoint-{SAVE_STEPS}"),
            }
        outcome["sharding"] = sharded.sharding(run)
    sharded.write_json(out, outcome)
    print(f"{engine}/{trainer}: checkpoint-{SAVE_STEPS} holds", *outcome["with"]["checkpoint"].items(),
          sep="\n  ")


def reference_shapes(trainer: str) -> dict[str, list[int]]:
    """The unsharded model's parameters (names and shapes), built here in the pytest process."""
    from tests.sharded import model

    reference = model()
    if trainer == "sft_lora":
        from peft import get_peft_model

        from tests.trl_peft import tiny_lm

        reference = get_peft_model(reference, tiny_lm.lora_config())
    return {name: list(p.shape) for name, p in reference.named_parameters()}


def check_sharding(engine: str, trainer: str, facts: dict, rank: int, shapes: dict[str, list[int]]) -> None:
    parameters = facts["parameters"]
    if engine == "ddp":
        assert facts["wrapper"] == "DistributedDataParallel"
    if engine in ("ddp", "zero1", "zero2"):  # ZeRO-1/2 partition the optimizer state and gradients only
        assert {name: p["local_shape"] for name, p in parameters.items()} == shapes
        assert {p["kind"] for p in parameters.values()} == {"tensor"}
    if engine in DEEPSPEED_STAGES:
        assert facts["wrapper"] == "DeepSpeedEngine"
    if engine == "zero3":
        assert set(parameters) == set(shapes)
        for name, p in parameters.items():
            numel = 1
            for size in shapes[name]:
                numel *= size
            assert (p["kind"], p["numel"], p["local_shape"]) == ("zero3", 0, [0]), name
            assert (p["ds_shape"], p["ds_numel"]) == (shapes[name], numel), name
            assert p["ds_tensor_numel"] == -(-numel // 2), name  # this rank's half, padded
    if engine in FSDP_ENGINES and FSDP_ENGINES[engine][0] == 2:
        assert facts["wrapper"] == facts["model"] and facts["model"].startswith("FSDP")
        assert set(parameters) == set(shapes)
        for name, p in parameters.items():
            rows = shapes[name][0]
            local_rows = min(-(-rows // 2), max(rows - rank * -(-rows // 2), 0))
            assert p["kind"] == "dtensor" and p["placements"] == ["S(0)"], name  # Shard(0)
            assert p["global_shape"] == shapes[name], name
            assert p["local_shape"] == [local_rows, *shapes[name][1:]], name
    if engine in FSDP_ENGINES and FSDP_ENGINES[engine][0] == 1:
        assert facts["wrapper"] == "FullyShardedDataParallel"
        assert set(parameters) == set(shapes)  # use_orig_params (transformers' default): 1-D views
        assert all(len(p["local_shape"]) == 1 for p in parameters.values())
        flat = facts["flat_parameters"]  # one per wrapped module: each rank holds its half
        assert len(flat) >= 2 and all(len(f["local_shape"]) == 1 for f in flat)
        assert sum(f["full_numel"] for f in flat) == sum(_numel(shape) for shape in shapes.values())
        for f in flat:
            assert f["local_shape"][0] == -(-f["full_numel"] // 2)  # padded to an even split


def _numel(shape: list[int]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def check_baseline(outcome, engine: str, trainer: str, reference=None) -> None:
    ranks = outcome.json()
    shapes = reference_shapes(trainer)
    for rank, got in enumerate(ranks):
        check_sharding(engine, trainer, got["sharding"], rank, shapes)
        without, with_callback = got["without"], got["with"]
        assert with_callback["records"] == without["records"]  # bit-identical: == on floats
        kinds = {key for record in without["records"] for key in record}
        assert {"loss", "grad_norm", "eval_loss", "learning_rate"} <= kinds
        assert [r["step"] for r in without["records"] if "loss" in r] == list(range(1, STEPS + 1))
        assert with_callback["weights"] == without["weights"]
        assert {name: w["shape"] for name, w in without["weights"].items()} == shapes
        assert set(with_callback["checkpoint"]) == set(without["checkpoint"])
        if trainer == "trainer":
            assert set(with_callback["checkpoint"]) == LAYOUT[engine]
    assert ranks[0]["with"]["records"] == ranks[1]["with"]["records"]
    assert ranks[0]["with"]["weights"] == ranks[1]["with"]["weights"]
    if trainer != "sft_lora":  # (peft saves the adapter only, in its own layout)
        # what the engine saved (its own files, read in this process) is what full_weights gathered
        saved = saved_weights(outcome.dir / "with" / f"checkpoint-{SAVE_STEPS}")
        assert {name: digest(tensor) for name, tensor in saved.items()} == {
            name: w["digest"] for name, w in ranks[0]["with"]["weights"].items()}
    if reference is not None:  # the DDP run of the same trainer: the same training, up to reduction order
        expected = reference.json()[0]["with"]
        for name, value in ranks[0]["with"]["sums"].items():
            assert value == pytest.approx(expected["sums"][name], rel=1e-4, abs=1e-4), name
        losses = [r["loss"] for r in ranks[0]["with"]["records"] if "loss" in r]
        assert losses == pytest.approx([r["loss"] for r in expected["records"] if "loss" in r], rel=1e-4)


FIRST_TIER = ("ddp", "zero3", "fsdp2", "fsdp1_full")  # each kind of shard, both state-dict types


@pytest.mark.parametrize("engine", engine_scenarios(baseline, first_tier=FIRST_TIER, reference="ddp"))
def test_sharding_is_real_and_a_callback_changes_no_record(engine, distributed_outcome, distributed_launch):
    from tests.distributed import spec_of

    reference = distributed_launch.outcome(spec_of(baseline, ("ddp",)))
    check_baseline(distributed_outcome, engine, "trainer", reference)


@pytest.mark.parametrize(("engine", "trainer"),
                         [param for param in engine_scenarios(baseline, trainers=TRAINERS, first_tier=(),
                                                              reference="ddp")
                          if param.values[1] != "trainer"])
@pytest.mark.second_tier
def test_every_trainer_under_every_engine(engine, trainer, distributed_outcome, distributed_launch):
    from tests.distributed import spec_of

    reference = distributed_launch.outcome(spec_of(baseline, ("ddp", trainer)))
    check_baseline(distributed_outcome, engine, trainer, reference)
