"""`GenerationSamples`: what a generative model writes for a few fixed prompts, at every evaluation.

The way trl logs completions (a bounded table per logging step), for any causal LM trained with
``Trainer`` or trl: greedy generations for the same prompts at each evaluation, one JSON line per
prompt in ``<output_dir>/generations/step-<N>.jsonl`` on rank 0, optionally uploaded to the MLflow
/ W&B runs of this package's loggers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from ..core.callback import TrainerCallback

__all__ = ["GenerationSamples"]

logger = logging.getLogger("hf_callbacks_plus")


class GenerationSamples(TrainerCallback):
    """Greedy generations for fixed prompts after every evaluation, written to a file.

    Args:
        prompts: The prompts. Defaults to None: the first ``num_samples`` rows of the eval
            dataset's ``"prompt"`` column, else the first half of the words of its ``"text"``.
        num_samples: Prompts taken from the eval dataset when ``prompts`` is None. Defaults to 4.
        max_new_tokens: Tokens generated per prompt. Defaults to 32.
        output_dir: Folder of the files. Defaults to ``<output_dir>/generations``.
        log_to_trackers: Also upload each file to the runs of this package's loggers that keep
            files (MLflow, W&B). Defaults to False.

    Raises:
        ValueError: ``num_samples`` or ``max_new_tokens`` is below 1, or ``prompts`` is empty.
        TypeError: ``prompts`` is not a sequence of strings.

    Note:
        Generation runs on rank 0 only, with the model in eval mode and without gradients, and
        costs ``len(prompts)`` generate calls per evaluation. The tokenizer is the trainer's
        ``processing_class``.
    """

    def __init__(
        self,
        prompts: Optional[Sequence[str]] = None,
        *,
        num_samples: int = 4,
        max_new_tokens: int = 32,
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
        for name, value in (("num_samples", num_samples), ("max_new_tokens", max_new_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GenerationSamples: {name} must be an int >= 1, got {value!r}.")
        self.prompts = list(prompts) if prompts is not None else None
        self.num_samples = num_samples
        self.max_new_tokens = max_new_tokens
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.log_to_trackers = log_to_trackers
        self.trainer: Any = None
        self.files: list[Path] = []

    def bind(self, trainer: Any) -> GenerationSamples:
        """Give the callback its trainer (for the eval dataset and the loggers)."""
        self.trainer = trainer
        return self

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Choose the prompts now (a clear error if there are none)."""
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
        """Generate for every prompt and write the file (rank 0)."""
        if not getattr(state, "is_world_process_zero", True) or model is None or not self.prompts:
            return
        tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        if tokenizer is None:
            raise ValueError(
                "GenerationSamples: the trainer has no processing_class (tokenizer) to encode prompts."
            )
        rows = [
            {
                "step": state.global_step,
                "prompt": prompt,
                "completion": self._generate(model, tokenizer, prompt),
            }
            for prompt in self.prompts
        ]
        folder = self.output_dir or Path(args.output_dir) / "generations"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"step-{state.global_step}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        self.files.append(path)
        if self.log_to_trackers:
            for callback in getattr(getattr(self.trainer, "callback_handler", None), "callbacks", []):
                log_file = getattr(callback, "log_file", None)
                if callable(log_file):
                    log_file(path, f"generations_step-{state.global_step}", "generations")

    def _generate(self, model: Any, tokenizer: Any, prompt: str) -> str:
        import torch

        was_training = model.training
        model.eval()
        try:
            encoded = tokenizer(prompt, return_tensors="pt").to(model.device)
            with torch.no_grad():
                output = model.generate(
                    **encoded,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
        finally:
            model.train(was_training)
        return tokenizer.decode(output[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
