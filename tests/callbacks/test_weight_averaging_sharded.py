"""WeightAveraging under every engine with real sharding on 2 CPU ranks (DDP, DeepSpeed ZeRO-1/2/3,
FSDP2 and FSDP1 with both state-dict types; a stock ``Trainer`` and trl's ``SFTTrainer`` with LoRA),
scenario ``tests/callbacks/weight_averaging_sharded.py``.

Ground truth, independent of the callback: every parameter gathered whole after each optimizer
step and averaged in float64 in the scenario. Shown here, under each engine: the weights each
averaged evaluation ran on equal that reference within float32 rounding (point 2); each rank
keeps its own part (``4 * P / W`` bytes: the sizes of both ranks add up to the trainable fp32
bytes, half each), with no gather; evaluating on the average leaves the training bit-identical
(records and final weights equal the run without WeightAveraging, point 3); every checkpoint has
each rank's file, the one the uninterrupted run wrote; a run stopped after checkpoint-4 and resumed
by a new trainer reads it back exactly and ends with each rank's average, the weights and the
records bit-identical to the uninterrupted run (point 4; FSDP1: see `RESUME_DIFFERS`).
"""

from __future__ import annotations

import pytest

from hf_callbacks_plus.metrics.keys import RUN_COUNTERS
from tests.callbacks.weight_averaging_sharded import EVERY, STEPS, STOP_AT, averaging_under_engine
from tests.sharded import engine_scenarios

pytestmark = [pytest.mark.transformers, pytest.mark.slow]
pytest.importorskip("deepspeed")
pytest.importorskip("trl")


#: Engines whose own resume does not reproduce the uninterrupted run on the CPU harness (FSDP1: its
#: weights after the resume differ from the uninterrupted run's from step 5 on, its loss at step 6
#: too; docs/distributed.md says so of KeepBestCheckpoints' resumes): there the test stops at the
#: hand-over (the average each rank reads back is the checkpoint's, the uninterrupted run's).
RESUME_DIFFERS = ("fsdp1_full", "fsdp1_sharded")


def _trainable(name: str, trainer: str) -> bool:
    return trainer != "sft_lora" or "lora_" in name


def check(folder, engine: str, trainer: str, ranks: list[dict]) -> None:
    import torch

    from tests.callbacks.test_restore_best_sharded import trainable_bytes

    rank0 = ranks[0]
    raw = [r for r in rank0["with"] if not any(k.startswith("eval_ema_") for k in r)]
    assert raw == rank0["without"]  # the trainer's own records, bit for bit
    averaged = [r for r in rank0["with"] if "eval_ema_loss" in r]
    assert [r["step"] for r in averaged] == list(range(EVERY, STEPS + 1, EVERY))
    for record in averaged:  # trl's own eval_ metrics of the averaged evaluation carry the label too
        assert all(k.startswith("eval_ema_") for k in record if k.startswith("eval_")), record
    final_with, final_without = (torch.load(folder / f"final-{name}.pt", weights_only=True)
                                 for name in ("with", "without"))
    for name, tensor in final_without.items():
        assert torch.equal(final_with[name], tensor), name
    # the averaged evaluations ran on the reference average (float64, from the gathered weights)
    reference = torch.load(folder / "reference.pt", weights_only=True)
    assert sorted(reference["evaluated"]) == list(range(EVERY, STEPS + 1, EVERY))
    for step, evaluated in reference["evaluated"].items():
        expected = reference["after"][step]
        trained = [name for name in expected if _trainable(name, trainer)]
        assert trained
        for name in trained:
            torch.testing.assert_close(evaluated[name], expected[name], rtol=1e-6, atol=1e-6)
        assert any(not torch.equal(evaluated[n].float(), final_with[n]) for n in trained) or step != STEPS
    # each rank keeps its own part, fp32
    full = trainable_bytes(trainer)
    sizes = [got["with_average"]["nbytes"] for got in ranks]
    if engine == "ddp":
        assert sizes == [full, full]
        assert rank0["files"] == [f"checkpoint-{s}/weight_average-ema.safetensors" for s in (2, 4, 6)]
    else:
        assert sum(sizes) == full and max(sizes) <= full // 2 + 256, sizes
        assert rank0["files"] == sorted(f"checkpoint-{s}/weight_average-ema-rank{r}.safetensors"
                                        for s in (2, 4, 6) for r in (0, 1))
        kinds = {key.split(".")[0] for key in rank0["with_average"]["keys"]}
        if engine.startswith("zero"):
            assert kinds == {"zero_fp32_partition"}
        elif engine.startswith("fsdp1"):
            assert kinds == {"fsdp1_flat_param"}
    # each rank reads back exactly the average of the checkpoint; its file equals the uninterrupted run's
    from safetensors.torch import load_file

    for rank in (0, 1):
        name = "weight_average-ema" + ("" if engine == "ddp" else f"-rank{rank}") + ".safetensors"
        saved = load_file(folder / "cut" / f"checkpoint-{STOP_AT}" / name)
        uninterrupted = load_file(folder / "with" / f"checkpoint-{STOP_AT}" / name)
        read = torch.load(folder / f"average-read-rank{rank}.pt", weights_only=True)
        assert saved.keys() == read.keys() == uninterrupted.keys()
        for key, tensor in saved.items():
            assert torch.equal(read[key], tensor) and torch.equal(uninterrupted[key], tensor), (rank, key)
    if engine in RESUME_DIFFERS:
        return
    # a resumed run ends bit-identical: each rank's average, the weights, the records
    for rank in (0, 1):
        whole = torch.load(folder / f"average-with-rank{rank}.pt", weights_only=True)
        again = torch.load(folder / f"average-resumed-rank{rank}.pt", weights_only=True)
        assert whole.keys() == again.keys()
        for key, tensor in whole.items():
            assert torch.equal(again[key], tensor), (rank, key)
    for got in ranks:
        assert got["resumed_average"]["steps"] == got["with_average"]["steps"] == STEPS
    final_resumed = torch.load(folder / "final-resumed.pt", weights_only=True)
    for name, tensor in final_with.items():
        assert torch.equal(final_resumed[name], tensor), name
    # the mean loss of each train() call's own steps; trl's token counter, which restarts at a resume
    def kept(record: dict) -> dict:
        return {k: v for k, v in record.items() if k != "train_loss" and not k.endswith(RUN_COUNTERS)}

    resumed, uninterrupted = [kept(r) for r in rank0["resumed"]], [kept(r) for r in rank0["with"]]
    assert resumed == uninterrupted


@pytest.mark.parametrize(("engine", "trainer"), engine_scenarios(
    averaging_under_engine, trainers=("trainer", "sft_lora"), first_tier=("zero3",)))  # FSDP: second tier
def test_the_average_under_each_engine(engine, trainer, distributed_outcome):
    check(distributed_outcome.dir, engine, trainer, distributed_outcome.json())
