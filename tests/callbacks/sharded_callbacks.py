"""The scenario that trains under each sharding engine with the callbacks that touch the parameters:
``GenerationSamples`` and ``EarlyStopping(restore_best=True)`` (tests/sharded.py runs the engines).

Under ``engine`` and a trainer kind, on the 2 ranks of the suite's launch, the tiny Llama trains
``STEPS`` steps, evaluating and saving every ``EVERY`` steps, twice: without callbacks, and with

* ``EarlyStopping("eval_loss", mode="max", restore_best=True)``: ``mode="max"`` makes an early
  evaluation the best (the loss falls), so the restore changes the weights; patience never ends
  the run;
* ``GenerationSamples`` on ``PROMPTS`` (5 prompts of different lengths: uneven shares on 2 ranks,
  left padding in batches of ``BATCH``);
* test-side recorders, independent of the callbacks: ``WeightsAtEvaluation`` (every parameter
  gathered whole at each evaluation, rank 0 saves them: the generation's ground truth) and
  ``CopyCheckpoints`` (a copy of every checkpoint before rotation deletes it: the weights "as the
  engine saved them" at the best step).

``variant``: ``plain``; ``resume`` (``save_total_limit=1``, so the best checkpoint is rotated away;
the run is stopped after the checkpoint of ``STOP_AT``, after the best, and a new trainer with new
callbacks resumes from it); ``bf16`` (mixed precision: bf16 weights and
fp32 masters under DeepSpeed, bf16 compute over fp32 shards under FSDP); ``persistent`` (ZeRO-3 with
its default-like persistence threshold: small parameters stay whole on every rank).

Each rank writes ``outcome-rank<R>.json``: the trainer's records of both runs, the best step the
callback chose, its copy's size on this rank, the generation files; rank 0 writes ``final.pt`` (the
weights gathered after training) and ``weights-<step>.pt``; ``final_model/`` is what the user saves
after training (`save_final_model`), ``final_engine/`` a DeepSpeed checkpoint of the engine then.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

STEPS, EVERY, STOP_AT = 6, 2, 4
MAX_NEW_TOKENS, BATCH = 6, 2
VARIANTS = ("plain", "resume", "bf16", "persistent")


def prompts() -> list[str]:
    """5 held-out prompts of 2 to 6 words."""
    from tests.trl_peft import tiny_lm

    texts = tiny_lm.texts()[2000:2005]
    return [" ".join(text.split()[:words]) for text, words in zip(texts, (2, 5, 3, 6, 4))]


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


class WeightsAtEvaluation(TrainerCallback):
    """Gathers every parameter whole at each evaluation (a collective); rank 0 saves them."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.trainer = folder, None

    def on_evaluate(self, args, state, control, **kwargs):
        import torch

        from tests import sharded

        weights = sharded.full_weights(self.trainer)
        if rank() == 0:
            torch.save(weights, self.folder / f"weights-{state.global_step}.pt")


class CopyCheckpoints(TrainerCallback):
    """After every save (and every rank's files), rank 0 copies the checkpoint aside."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        dist.barrier()
        name = f"checkpoint-{state.global_step}"
        if rank() == 0:
            shutil.copytree(Path(args.output_dir) / name, self.folder / "copies" / name, dirs_exist_ok=True)
        dist.barrier()


class CopyAtTrainBegin(TrainerCallback):
    """Notes the step of the copy ``stopper`` holds right after its train begin (after a resume:
    the copy read back from the checkpoint)."""

    def __init__(self, stopper: Any, outcome: dict[str, Any]) -> None:
        self.stopper, self.outcome = stopper, outcome

    def on_train_begin(self, args, state, control, **kwargs):
        self.outcome["resumed_copy_step"] = self.stopper._best_weights.snapshot_step


class StopAt(TrainerCallback):
    """Ends the run after the checkpoint of ``step`` (standing in for a crash)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def training_kwargs(engine: str, variant: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"max_steps": STEPS, "eval_strategy": "steps", "eval_steps": EVERY,
                              "save_strategy": "steps", "save_steps": EVERY}
    if variant == "resume":
        kwargs["save_total_limit"] = 1
    if variant == "bf16":
        kwargs["bf16"] = True
        if engine.startswith("zero"):
            kwargs["deepspeed"] = {"bf16": {"enabled": "auto"}}
    if variant == "persistent":  # ZeRO-3 keeps parameters below this size whole on every rank
        kwargs["deepspeed"] = {"zero_optimization": {"stage3_param_persistence_threshold": 200}}
    return kwargs


def save_final_model(trainer: Any, folder: Path) -> None:
    """What a user saves after training: ``trainer.save_model``; with FSDP's
    ``SHARDED_STATE_DICT``, where ``save_model`` writes no weights (transformers 5.23), the engine's
    own save of the checkpoints (accelerate's ``save_fsdp_model``: ``pytorch_model_fsdp_0/``)."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if trainer.is_fsdp_enabled and "SHARDED" in str(plugin.state_dict_type):
        from accelerate.utils import save_fsdp_model

        save_fsdp_model(plugin, trainer.accelerator, trainer.model, str(folder))
    else:
        trainer.save_model(str(folder))


def nbytes(tensors: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def callbacks_under_engine(out: Path, engine: str, trainer: str = "trainer", variant: str = "plain") -> None:
    """See the module docstring."""
    from hf_callbacks_plus import GenerationSamples
    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from tests import sharded

    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}: expected one of {VARIANTS}")
    kwargs = training_kwargs(engine, variant)
    outcome: dict[str, Any] = {}
    with sharded.sharded_on_cpu():
        # the same lifecycle without the package's callbacks: the trainer's records to match
        without = sharded.make_trainer(engine, out / "without", trainer=trainer,
                                       callbacks=[StopAt(STOP_AT)] if variant == "resume" else [], **kwargs)
        without.train()
        outcome["without"] = sharded.records(without)
        if variant == "resume":
            without = sharded.make_trainer(engine, out / "without", trainer=trainer, **kwargs)
            without.train(resume_from_checkpoint=str(out / "without" / f"checkpoint-{STOP_AT}"))
            outcome["without_resumed"] = sharded.records(without)

        def callbacks() -> list[Any]:
            stopper = EarlyStopping("eval_loss", mode="max", patience=100, restore_best=True, report=False,
                                    verbose=False)
            samples = GenerationSamples(prompts(), max_new_tokens=MAX_NEW_TOKENS, batch_size=BATCH)
            return [stopper, samples, WeightsAtEvaluation(out), CopyCheckpoints(out)]

        run = out / "with"
        first = callbacks()
        if variant == "resume":
            first.append(StopAt(STOP_AT))
        with_callbacks = sharded.make_trainer(engine, run, trainer=trainer, callbacks=first, **kwargs)
        first[2].trainer = with_callbacks
        with_callbacks.train()
        records = sharded.records(with_callbacks)
        stopper, samples = first[0], first[1]
        if variant == "resume":  # a new trainer (new callbacks) resumes after the best step
            second = callbacks()
            second.append(CopyAtTrainBegin(second[0], outcome))
            with_callbacks = sharded.make_trainer(engine, run, trainer=trainer, callbacks=second, **kwargs)
            second[2].trainer = with_callbacks
            with_callbacks.train(resume_from_checkpoint=str(run / f"checkpoint-{STOP_AT}"))
            outcome["resumed_records"] = sharded.records(with_callbacks)
            stopper, samples = second[0], second[1]
        outcome["with"] = records
        copy = stopper._best_weights.snapshot or {}
        outcome.update(best_step=stopper.best_step, per_rank=stopper._best_weights.per_rank,
                       snapshot_bytes=nbytes(copy), snapshot_keys=sorted(copy),
                       files=[path.name for path in samples.files],
                       rank_files=[str(path.relative_to(run))
                                   for path in sorted(run.glob("checkpoint-*/best_weights-*"))])
        final = sharded.full_weights(with_callbacks)
        save_final_model(with_callbacks, out / "final_model")
        if with_callbacks.is_deepspeed_enabled:  # ZeRO's own checkpoint: its fp32 master weights
            with_callbacks.model_wrapped.save_checkpoint(str(out / "final_engine"))
        if rank() == 0:
            import torch

            torch.save(final, out / "final.pt")
    sharded.write_json(out, outcome)
