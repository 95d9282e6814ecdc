"""EarlyStopping(restore_best=True) on models whose weights the engine shards: DeepSpeed ZeRO-1/2/3,
FSDP2, FSDP1 (both state-dict types), and DDP as the reference, through a stock ``Trainer``,
``TrainerPlus`` and trl's ``SFTTrainer`` with LoRA, on the 2 ranks of the suite's launch (scenario:
``tests/callbacks/sharded_callbacks.py``); and a model sharded by hand with ``fully_shard`` in
``LightweightTrainer``. Before, every sharded model was refused at train begin.

Ground truth, independent of the callback: the best step is computed here from the trainer's
records (``mode="max"`` on ``eval_loss``: the first evaluation, so the restore changes the
weights); the expected weights are the best step's checkpoint as the engine saved it, read in
this process from its own files (``tests/sharded.saved_weights``: consolidated weights, ZeRO's
fp32 masters through ``zero_to_fp32``, FSDP's distributed checkpoint, a peft adapter; from a copy
taken before rotation deleted it), and every parameter gathered whole at the best evaluation.
After training the weights gathered from the ranks, and what the user saves then, equal them
bit for bit. Each rank's copy is its own part: its size is measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.callbacks.sharded_callbacks import EVERY, STEPS, STOP_AT, callbacks_under_engine
from tests.sharded import TRAINERS, engine_scenarios, saved_weights

pytestmark = [pytest.mark.transformers, pytest.mark.slow]
pytest.importorskip("deepspeed")
pytest.importorskip("trl")

FIRST_TIER = ("zero3", "fsdp2")
#: (engine, trainer) whose checkpoints hold no model weights, so a resume restarts from the first
#: weights: FSDP1 with a peft model writes an empty ``pytorch_model_fsdp_0/`` (SHARDED_STATE_DICT),
#: an empty ``adapter_model.safetensors`` and ``pytorch_model_fsdp.bin`` (FULL_STATE_DICT)
#: (accelerate 1.15, transformers 5.23, peft 0.21, on the CPU harness)
EMPTY_CHECKPOINTS = {("fsdp1_sharded", "sft_lora"), ("fsdp1_full", "sft_lora")}


def expected_best_step(records: list[dict]) -> int:
    """``mode="max"``, ``min_delta=0``: the first evaluation whose loss beats every earlier one."""
    best_step, best = None, None
    for record in records:
        if "eval_loss" in record and (best is None or record["eval_loss"] > best):
            best_step, best = record["step"], record["eval_loss"]
    return best_step


def trainable_bytes(trainer: str) -> int:
    """Bytes of the trainable parameters of the unsharded model (fp32)."""
    from tests.test_sharded_engines import reference_shapes

    shapes = reference_shapes(trainer)
    total = 0
    for name, shape in shapes.items():
        if trainer == "sft_lora" and "lora_" not in name:
            continue
        numel = 1
        for size in shape:
            numel *= size
        total += 4 * numel
    return total


def check_restored(folder: Path, engine: str, trainer: str, ranks: list[dict], records: list[dict],
                   bf16_parameters: bool = False) -> None:
    """``bf16_parameters``: the engine holds bf16 parameters and saves fp32 masters (ZeRO-3 in bf16):
    the gathered parameters are then the saved masters rounded to bf16."""
    import torch

    best = expected_best_step(records)
    # the restore has something to do (except after a resume that restarted from the first weights)
    assert best < STEPS or (engine, trainer) in EMPTY_CHECKPOINTS
    assert [got["best_step"] for got in ranks] == [best, best]
    final = torch.load(folder / "final.pt", weights_only=True)
    at_best = torch.load(folder / f"weights-{best}.pt", weights_only=True)
    last = torch.load(folder / f"weights-{STEPS}.pt", weights_only=True)
    assert set(final) == set(at_best)
    for name, tensor in final.items():
        assert torch.equal(tensor, at_best[name]), name
    if best < STEPS:
        assert any(not torch.equal(final[name], last[name]) for name in final)  # training had moved on
    saved = saved_weights(folder / "copies" / f"checkpoint-{best}")  # as the engine saved it
    assert saved or (engine, trainer) in EMPTY_CHECKPOINTS
    for name, tensor in saved.items():
        assert torch.equal(final[name], tensor.bfloat16().float() if bf16_parameters else tensor), name
    # what the user saves after training (the whole model, or the adapter, as the engine saves it)
    expected = {**at_best, **saved}
    for name, tensor in saved_weights(folder / "final_model").items():
        assert torch.equal(tensor, expected[name]), name


def check_copies(folder: Path, engine: str, trainer: str, ranks: list[dict]) -> None:
    """Each rank keeps its own part (one shard of memory) and writes it into every checkpoint."""
    full = trainable_bytes(trainer)
    if engine == "ddp":  # unchanged: the whole trainable state, from rank 0's file or checkpoint
        assert not any(got["per_rank"] for got in ranks)
        return
    sizes = [got["snapshot_bytes"] for got in ranks]
    assert all(got["per_rank"] for got in ranks)
    assert sum(sizes) == full and max(sizes) <= full // 2 + 256, sizes  # a half each (FSDP2: by rows)
    kinds = {key.split(".")[0] for key in ranks[0]["snapshot_keys"]}
    if engine.startswith("zero"):
        assert kinds == {"zero_fp32_partition"}  # the fp32 masters, not the (bf16) parameters
    elif engine.startswith("fsdp1"):
        assert kinds == {"fsdp1_flat_param"}
    saves = [step for step in range(EVERY, STEPS + 1, EVERY)
             if (folder / "with" / f"checkpoint-{step}").is_dir()]
    for step in saves:
        assert {f"checkpoint-{step}/best_weights-EarlyStopping_eval_loss_max-rank{rank}.safetensors"
                for rank in (0, 1)} <= set(ranks[0]["rank_files"])


@pytest.mark.parametrize(("engine", "trainer"), engine_scenarios(callbacks_under_engine, trainers=TRAINERS,
                                                                 first_tier=FIRST_TIER))
def test_restores_the_best_step_as_the_engine_saved_it(engine, trainer, distributed_outcome):
    ranks = distributed_outcome.json()
    for got in ranks:  # the trainer's own records unchanged
        assert got["with"] == got["without"]
    check_restored(distributed_outcome.dir, engine, trainer, ranks, ranks[0]["with"])
    check_copies(distributed_outcome.dir, engine, trainer, ranks)


@pytest.mark.parametrize(("engine", "trainer", "variant"), engine_scenarios(
    callbacks_under_engine, trainers=TRAINERS, first_tier=(), args=("resume",)))
def test_the_best_survives_a_resume_after_its_checkpoint_was_rotated(engine, trainer, variant,
                                                                      distributed_outcome):
    """``save_total_limit=1``: checkpoint-2 (the best) is gone when the run stops after checkpoint-4;
    a new trainer resumes from checkpoint-4, and each rank reads back its part of the best step
    from its file there (``best_weights-<key>-rank<R>.safetensors``). Second tier (about 10 s a
    scenario); the first tier reads such a file back in one process
    (``tests/runtime/test_engines.py``)."""
    folder = distributed_outcome.dir
    ranks = distributed_outcome.json()
    for got in ranks:
        assert got["with"] == got["without"] and got["resumed_records"] == got["without_resumed"]
    first_best = expected_best_step(ranks[0]["with"])
    assert first_best < STOP_AT and not (folder / "with" / f"checkpoint-{first_best}").exists()  # rotated
    assert [got["resumed_copy_step"] for got in ranks] == [first_best, first_best]  # read back at train begin
    records = ranks[0]["resumed_records"]  # the resumed run's history: the first run's records, then its own
    if (engine, trainer) not in EMPTY_CHECKPOINTS:  # (there the resume restarts from the first weights)
        assert expected_best_step(records) == first_best
    check_restored(folder, engine, trainer, ranks, records)


@pytest.mark.parametrize(("engine", "trainer", "variant"), [
    *engine_scenarios(callbacks_under_engine, ("zero2", "zero3", "fsdp2", "fsdp1_full"), first_tier=(),
                      args=("trainer", "bf16")),
    *engine_scenarios(callbacks_under_engine, ("zero3",), first_tier=(), trainers=("trainer", "sft_lora"),
                      args=("persistent",))])
@pytest.mark.second_tier
def test_mixed_precision_and_persistent_parameters(engine, trainer, variant, distributed_outcome):
    """bf16: ZeRO keeps bf16 parameters and fp32 masters (both put back: the saved model and ZeRO's
    own checkpoint equal the best step's); FSDP computes in bf16 over fp32 shards. persistent:
    ZeRO-3 keeps small parameters (the norms) whole on every rank, gathered again after the restore."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    folder = distributed_outcome.dir
    ranks = distributed_outcome.json()
    for got in ranks:
        assert got["with"] == got["without"]
    check_restored(folder, engine, trainer, ranks, ranks[0]["with"],
                   bf16_parameters=(engine, variant) == ("zero3", "bf16"))
    if engine.startswith("zero"):  # the fp32 masters, as ZeRO saves them in its own checkpoints
        best = ranks[0]["best_step"]
        expected = get_fp32_state_dict_from_zero_checkpoint(folder / "copies" / f"checkpoint-{best}")
        got = get_fp32_state_dict_from_zero_checkpoint(folder / "final_engine")  # frozen weights too
        assert expected and set(expected) <= set(got)
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), name


def by_hand(out: Path) -> None:
    """``LightweightTrainer`` with a model sharded by hand (``fully_shard``: DTensor shards, half on
    each rank), ``EarlyStopping(restore_best=True)`` with a scripted metric whose best is step 2
    of 4; a recorder gathers the weights at each evaluation. Then the same with
    ``sync_decision=False``, refused."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from hf_callbacks_plus.core.callback import TrainerCallback
    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [{"x": torch.randn(4, 8), "y": torch.randn(4, 1)} for _ in range(4)]
    gathered: dict[int, dict[str, list]] = {}

    def full() -> dict[str, list]:
        return {name: p.full_tensor().tolist() for name, p in model.named_parameters()}

    class Record(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            gathered[state.global_step] = full()

    def train_step(batch):
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        return float(loss.detach())

    def trainer(stopper):
        args = LoopArguments(output_dir=str(out / "run"), max_steps=4, eval_strategy="steps", eval_steps=2,
                             logging_steps=2)
        scripted = {2: 1.0, 4: 2.0}
        return LightweightTrainer(args, train_step=train_step, train_data=data, model=model,
                                  optimizer=optimizer, callbacks=[stopper, Record()],
                                  eval_fn=lambda _: {"loss": scripted[run.state.global_step]})

    stopper = EarlyStopping("eval_loss", mode="min", patience=5, restore_best=True, verbose=False)
    run = trainer(stopper)
    run.train()
    report = {"best_step": stopper.best_step, "final": full(),
              "gathered": {str(k): v for k, v in gathered.items()},
              "local_numel": sum(p.to_local().numel() for p in model.parameters()),
              "copy_numel": sum(t.numel() for t in stopper._best_weights.snapshot.values())}
    run = trainer(EarlyStopping("eval_loss", patience=5, restore_best=True, sync_decision=False))
    try:
        run.train()
    except ValueError as error:
        report["refused"] = str(error)
    (out / f"rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")


@pytest.mark.distributed(scenario=by_hand)
def test_a_model_sharded_by_hand_in_lightweight_trainer(distributed_outcome):
    reports = [json.loads((distributed_outcome.dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["best_step"] == 2
        assert report["final"] == report["gathered"]["2"] != report["gathered"]["4"]
        assert report["copy_numel"] == report["local_numel"] < 8 * 8 + 8 + 8 + 1  # its own shard only
        assert "sync_decision=True" in report["refused"] and "sharded" in report["refused"]
