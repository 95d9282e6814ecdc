"""`GenerationSamples`: what a generative model writes for a few fixed prompts, at every evaluation.

The way trl logs completions (a bounded table per logging step), for any causal LM trained with
``Trainer`` or trl: greedy generations for the same prompts at each evaluation, one JSON line per
prompt in ``<output_dir>/generations/step-<N>.jsonl`` on rank 0, optionally uploaded to the MLflow
/ W&B runs of this package's loggers.

Under several processes it works as trl's ``LogCompletionsCallback``: the prompts are split
across the ranks, each rank generates its part in left-padded batches, and the texts are gathered
to rank 0, which writes the file. Where the engine shards the parameters (DeepSpeed ZeRO-3, FSDP1,
FSDP2) every rank runs every forward pass together (``synced_gpus``), the engine gathering each
layer as it does for its own forward (``runtime/engines.py``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from ..core.callback import TrainerCallback
from ..core.checks import check_int
from ..runtime.distributed import all_gather_objects, distributed_rank, distributed_world_size
from ..runtime.engines import generation_model
from ..runtime.isolated_evaluation import evaluated_weights

__all__ = ["GenerationSamples"]

logger = logging.getLogger("hf_callbacks_plus")


class GenerationSamples(TrainerCallback):
    """Greedy generations for fixed prompts after every evaluation, written to a file.

    Args:
        prompts: The prompts. Defaults to None: the first ``num_samples`` rows of the eval
            dataset's ``"prompt"`` column, else the first half of the words of its ``"text"``.
        num_samples: Prompts taken from the eval dataset when ``prompts`` is None. Defaults to 4.
        max_new_tokens: Tokens generated per prompt. Defaults to 32.
        batch_size: Prompts per ``generate`` call on each rank (left-padded). Defaults to None:
            the trainer's ``per_device_eval_batch_size``.
        output_dir: Folder of the files. Defaults to ``<output_dir>/generations``.
        log_to_trackers: Also upload each file to the runs of this package's loggers that keep
            files (MLflow, W&B). Defaults to False.

    Raises:
        ValueError: ``num_samples``, ``max_new_tokens`` or ``batch_size`` is below 1, or
            ``prompts`` is empty.
        TypeError: ``prompts`` is not a sequence of strings.

    Note:
        Generation runs with the model in eval mode and without gradients, once per evaluation
        step (a second ``on_evaluate`` at the same step, for another eval set, reuses it). Under
        several processes the prompts are split across the ranks (rank ``r`` takes prompts ``r,
        r + world_size, ...``) and the texts gathered to rank 0, which alone writes the file.
        Where the parameters are sharded (DeepSpeed ZeRO-3, FSDP1, FSDP2) every rank makes the
        same number of ``generate`` calls (a rank short of prompts repeats one and drops its
        text) with ``synced_gpus=True``, and the engine gathers the parameters as for its own
        forward: no more memory than that. A completion is what the unsharded model with the
        same weights generates for that prompt. The cost per evaluation is ``ceil(len(prompts) /
        world_size / batch_size)`` generate calls per rank. The tokenizer is the trainer's
        ``processing_class``.
    """

    def __init__(
        self,
        prompts: Optional[Sequence[str]] = None,
        *,
        num_samples: int = 4,
        max_new_tokens: int = 32,
        batch_size: Optional[int] = None,
        output_dir: Optional[Union[str, os.PathLike]] = None,
        log_to_trackers: bool = False,
    ) -> None:
        if prompts is not None:
            if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
                raise TypeError(f"GenerationSamples: prompts must be a list of strings, got {prompts!r}.")
            if not prompts:
                raise ValueError(
                    "GenerationSamples: prompts is empty; pass prompts or None (from the eval set)."
                )
        for name, value in (("num_samples", num_samples), ("max_new_tokens", max_new_tokens),
                            ("batch_size", 1 if batch_size is None else batch_size)):
            check_int("GenerationSamples", name, value, minimum=1)
        self.prompts = list(prompts) if prompts is not None else None
        self.num_samples = num_samples
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.log_to_trackers = log_to_trackers
        self.trainer: Any = None
        self.files: list[Path] = []
        self._generated_step: Optional[tuple[int, Optional[str]]] = None

    def bind(self, trainer: Any) -> GenerationSamples:
        """Give the callback its trainer (for the eval dataset and the loggers)."""
        self.trainer = trainer
        return self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Choose the prompts now (a clear error if there are none)."""
        self._generated_step = None
        if self.prompts is None:
            self.prompts = self._prompts_from_eval_set()

    def _prompts_from_eval_set(self) -> list[str]:
        dataset = getattr(self.trainer, "eval_dataset", None)
        if isinstance(dataset, dict):
            dataset = next(iter(dataset.values()), None)
        columns = getattr(dataset, "column_names", None) or []
        if dataset is None or not ({"prompt", "text"} & set(columns)):
            raise ValueError(
                "GenerationSamples: no prompts given and the eval dataset has no 'prompt' or 'text' column "
                f"(columns: {columns}); pass GenerationSamples(prompts=[...]), or bind it to the trainer "
                "(run_before_integrations(trainer) for a stock Trainer)."
            )
        rows = dataset.select(range(min(self.num_samples, len(dataset))))
        if "prompt" in columns:
            return [str(row["prompt"]) for row in rows]
        return [
            " ".join(str(row["text"]).split()[: max(1, len(str(row["text"]).split()) // 2)]) for row in rows
        ]

    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Generate for every prompt (split across the ranks) and write the file (rank 0)."""
        label = evaluated_weights(self.trainer) if self.trainer is not None else None
        if model is None or not self.prompts or self._generated_step == (state.global_step, label):
            return
        tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        if tokenizer is None:
            raise ValueError(
                "GenerationSamples: the trainer has no processing_class (tokenizer) to encode prompts."
            )
        self._generated_step = (state.global_step, label)
        completions = self._generate_share(model, tokenizer, args)
        if distributed_world_size() > 1:
            for share in all_gather_objects(completions):
                completions.update(share)
        if distributed_rank() != 0 or not getattr(state, "is_world_process_zero", True):
            return
        rows = [
            {"step": state.global_step, "prompt": prompt, "completion": completions[index]}
            for index, prompt in enumerate(self.prompts)
        ]
        folder = self.output_dir or Path(args.output_dir) / "generations"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"step-{state.global_step}" + (f"-{label}" if label else "")
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        self.files.append(path)
        if self.log_to_trackers:
            for callback in getattr(getattr(self.trainer, "callback_handler", None), "callbacks", []):
                log_file = getattr(callback, "log_file", None)
                if callable(log_file):
                    log_file(path, f"generations_{name}", "generations")

    def _generate_share(self, model: Any, tokenizer: Any, args: Any) -> dict[int, str]:
        """This rank's completions, by prompt index (under sharding, every rank calls it together)."""
        import torch

        prompts = self.prompts or []
        rank, world = distributed_rank(), distributed_world_size()
        mine = list(range(rank, len(prompts), world))
        batch = self.batch_size or int(getattr(args, "per_device_eval_batch_size", 0) or 8)
        completions: dict[int, str] = {}
        was_training = model.training
        model.eval()
        try:
            with generation_model(model) as (module, every_rank), torch.no_grad():
                synced = every_rank and world > 1
                # under sharding every rank makes as many calls as the rank with the most prompts
                share = -(-len(prompts) // world) if synced else len(mine)
                for start in range(0, share, batch):
                    indices = mine[start:start + batch]
                    texts = [prompts[i] for i in indices] or [prompts[0]]  # a spare call, dropped
                    completions.update(zip(indices, self._generate(module, tokenizer, texts, synced)))
        finally:
            model.train(was_training)
        return completions

    def _generate(self, model: Any, tokenizer: Any, prompts: list[str], synced: bool) -> list[str]:
        """Greedy completions of ``prompts``, generated in one left-padded batch."""
        side, pad = tokenizer.padding_side, tokenizer.pad_token
        borrow = pad is None and tokenizer.eos_token is not None and len(prompts) > 1  # pad with EOS
        tokenizer.padding_side = "left"
        if borrow:
            tokenizer.pad_token = tokenizer.eos_token
        try:
            encoded = tokenizer(prompts, return_tensors="pt", padding=len(prompts) > 1)
        finally:
            tokenizer.padding_side = side
            if borrow:
                tokenizer.pad_token = pad
        device = getattr(model, "device", None) or next(model.parameters()).device
        encoded = encoded.to(device)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        output = model.generate(
            **encoded,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            synced_gpus=synced,
        )
        return tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
