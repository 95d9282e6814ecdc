"""``WandbLogger``: Weights & Biases logging that never blocks training and reattaches on resume.

On top of `TrackerLogger` (background worker, retry,
spill, key grammar, value normalization, redacted config, rank zero, checkpointed run id):

* one step axis: every row is logged with ``step=global_step`` and carries
  ``train/global_step``, and ``define_metric("*", step_metric="train/global_step")`` makes
  every section (``train/``, ``eval/``, ``eval/<dataset>/``, ``test/``, custom) plot against it;
* end-of-training totals (``train_runtime``...) and text values go to ``run.summary``;
* W&B keeps one value per key and step: a later value of a key already in the current step's
  row (``trainer.evaluate()`` on other data right after an evaluation at that step), or a value
  at a step the run is already past, goes to ``run.summary`` (under the same key), with one
  warning per key; the history row keeps the first value. Nothing is dropped silently;
* W&B records the program's command line in its run metadata: when the command line passes a
  secret (``--hub_token hf_...``, any flag naming a token, secret, password or api key, or a
  value that looks like an access token), the logger turns W&B's metadata collection off
  (``x_disable_meta=True``, unless your ``settings`` set it), with one warning;
* the run id is known from ``on_train_begin`` on (generated up front), saved in every
  checkpoint, and a ``resume_from_checkpoint`` training reattaches to the same run
  (``wandb.init(id=..., resume="allow")``). Steps the run already holds are not logged again:
  W&B would reject steps lower than its current step, so the logger asks the resumed run
  (online: ``run.starting_step`` and its summary keys; offline: the earlier offline run files
  of the same id, read with `read_wandb_run`);
* ``run.finish(exit_code=0)`` at train end, ``exit_code=1`` when training raised (the
  ``on_exception`` event of ``TrainerPlus``/``LightweightTrainer``, and, in a stock
  ``transformers.Trainer``, an exit hook that runs before W&B's own when ``on_train_end``
  never came);
* transformers' environment variables keep working: ``WANDB_PROJECT`` (default
  ``"huggingface"``), ``WANDB_RUN_ID``, ``WANDB_LOG_MODEL``, ``WANDB_WATCH``,
  ``WANDB_DISABLED``, ``WANDB_MODE`` (and everything ``wandb.init`` reads itself:
  ``WANDB_ENTITY``, ``WANDB_DIR``, ``WANDB_TAGS``...).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

from .._compat import require
from .base import FAILED, FINISHED, TrackerLogger
from .secrets import mask_secrets
from .wandb_options import (
    LOG_MODEL_CHOICES,
    MAX_TAG_LENGTH,
    MODE_CHOICES,
    RESUME_CHOICES,
    STEP_KEY,
    WATCH_CHOICES,
    choice,
    settings_hiding_secret_args,
    typed,
    version_of,
    wandb_disabled_reason,
)

__all__ = ["LOG_MODEL_CHOICES", "WATCH_CHOICES", "WandbLogger", "wandb_disabled_reason"]

logger = logging.getLogger("hf_callbacks_plus")


class WandbLogger(TrackerLogger):
    """Logs to Weights & Biases from a background thread; one run per training, resumable.

    Args:
        project: W&B project. Defaults to ``WANDB_PROJECT``, else ``"huggingface"`` (like
            transformers' ``WandbCallback``).
        entity: W&B entity (team or user). Defaults to W&B's own (``WANDB_ENTITY``).
        run_id: Run id to log to (an existing run is continued). Defaults to ``WANDB_RUN_ID``,
            else the id saved in the checkpoint being resumed, else a new id.
        name: Display name. Defaults to ``TrainingArguments.run_name`` when it is set and
            differs from ``output_dir``, else W&B's generated name.
        tags: Run tags. Defaults to None (W&B also reads ``WANDB_TAGS``).
        group: Run group. Defaults to None.
        log_model: ``"false"``, ``"end"`` (the final model as an artifact) or
            ``"checkpoint"`` (every saved checkpoint as an artifact). Defaults to
            ``WANDB_LOG_MODEL``, else ``"false"``.
        watch: ``wandb.watch`` the model: ``"false"``, ``"gradients"``, ``"parameters"`` or
            ``"all"``. Defaults to ``WANDB_WATCH``, else ``"false"``.
        mode: ``"online"``, ``"offline"``, ``"disabled"`` or ``"shared"``. Defaults to W&B's
            own choice (``WANDB_MODE``).
        resume: How a run id from a checkpoint or ``run_id`` is reattached: ``"allow"``
            (continue it, or create it when it does not exist) or ``"must"`` (fail when it
            does not exist). Defaults to "allow".
        dir: Directory W&B writes its files to. Defaults to W&B's (``WANDB_DIR``, else the
            working directory).
        settings: Extra ``wandb.Settings`` (or a dict of them). Defaults to None. When the
            command line holds a secret, ``x_disable_meta=True`` is added unless you set it.
        **kwargs: Options of `TrackerLogger`
            (``log_config``, ``nonfinite``, ``flush_timeout``, ``spill_dir``...).

    Raises:
        ModuleNotFoundError: ``wandb`` is not installed (install ``hf-callbacks-plus[wandb]``).
            Not raised when W&B is disabled: the logger is then a no-op.
        ValueError: An argument or environment variable has an invalid value.

    Example:
        >>> from hf_callbacks_plus import WandbLogger
        >>> trainer = Trainer(..., args=TrainingArguments(..., report_to="none"),  # doctest: +SKIP
        ...                   callbacks=[WandbLogger(project="my-project")])
    """

    max_param_length = 10_000

    def __init__(
        self,
        project: Optional[str] = None,
        entity: Optional[str] = None,
        run_id: Optional[str] = None,
        name: Optional[str] = None,
        tags: Optional[Sequence[str]] = None,
        group: Optional[str] = None,
        log_model: Optional[str] = None,
        watch: Optional[str] = None,
        mode: Optional[str] = None,
        resume: str = "allow",
        dir: Optional[str] = None,
        settings: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if mode is not None and mode not in MODE_CHOICES:
            raise ValueError(f"WandbLogger: mode={mode!r} is not valid; choose one of {MODE_CHOICES} "
                             "or None.")
        if resume not in RESUME_CHOICES:
            raise ValueError(f"WandbLogger: resume={resume!r} is not valid; choose one of {RESUME_CHOICES}.")
        if tags is not None and (isinstance(tags, str) or not all(isinstance(t, str) for t in tags)):
            raise TypeError(f"WandbLogger: tags must be a list of strings, got {tags!r}")
        self.project = project
        self.entity = entity
        self.name = name
        self.tags = [mask_secrets(tag) for tag in tags] if tags is not None else None
        self.group = group
        self.mode = mode
        self.resume = resume
        self.dir = dir
        self.settings = settings
        self.log_model = choice("log_model", log_model, "WANDB_LOG_MODEL", "false", LOG_MODEL_CHOICES)
        self.watch = choice("watch", watch, "WANDB_WATCH", "false", WATCH_CHOICES)
        self._given = {"project": project, "run_id": run_id, "log_model": log_model, "watch": watch}
        self.explicit_run_id = run_id or os.environ.get("WANDB_RUN_ID") or None
        #: Why the logger does nothing (``WANDB_DISABLED``, ``mode="disabled"``), or None.
        self.disabled_reason = wandb_disabled_reason(mode)
        self._wandb: Any = None
        self._run: Any = None
        self._owns_run = True
        self._exit_hook_registered = False
        self._min_step = 0
        self._row_step = -1  # step of the last history row written in this session
        self._row_keys: set[str] = set()
        self._row_open = False  # the row at _row_step was written by the open run
        self._model: Any = None
        self._run_name_from_args: Optional[str] = None
        if self.disabled_reason is not None:
            logger.warning("WandbLogger is disabled because %s: nothing will be logged to W&B. "
                           "Unset it to log.", self.disabled_reason)
            return
        self._wandb = require("wandb", "WandbLogger")

    @property
    def disabled(self) -> bool:
        """True when W&B is disabled; every event is then a no-op."""
        return self.disabled_reason is not None

    @property
    def run(self) -> Any:
        """The ``wandb`` run being logged to (None before the worker opened it)."""
        return self._run

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger (the run id is in the attributes)."""
        return {"project": self.project, "entity": self.entity, "name": self.name, "tags": self.tags,
                "group": self.group, "log_model": self._given["log_model"], "watch": self._given["watch"],
                "mode": self.mode, "resume": self.resume, "dir": self.dir}

    # -- events (no-ops when disabled) ---------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Restore the run id from the checkpoint, start the run in the background."""
        if self.disabled:
            return
        self._model = model
        run_name = getattr(args, "run_name", None)
        from_args = run_name and run_name != getattr(args, "output_dir", None)
        self._run_name_from_args = run_name if from_args else None
        self._row_step, self._row_keys, self._row_open = -1, set(), False
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        """Queue the record for the background worker; returns immediately."""
        if not self.disabled:
            super().on_log(args, state, control, logs=logs, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """With ``log_model="checkpoint"``, queue the checkpoint folder as a model artifact."""
        super().on_save(args, state, control, **kwargs)
        if self.disabled or self.log_model != "checkpoint" or self._worker is None:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self._worker.submit({"kind": "wandb_artifact", "path": str(folder), "cleanup": False,
                             "aliases": [f"checkpoint_global_step_{state.global_step}"]})

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Queue the final model (``log_model="end"``), flush and finish the run (exit code 0)."""
        if self.disabled:
            return
        if self.log_model == "end" and self._worker is not None and model is not None:
            self._queue_final_model(model)
        super().on_train_end(args, state, control, **kwargs)

    def on_exception(self, args: Any, state: Any, control: Any, exception: Any = None, **kwargs: Any):
        """Flush and finish the run with exit code 1."""
        if not self.disabled:
            super().on_exception(args, state, control, exception=exception, **kwargs)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any):
        """Learn evaluation prefixes from the metrics."""
        if not self.disabled:
            super().on_evaluate(args, state, control, metrics=metrics, **kwargs)

    # -- run lifecycle ----------------------------------------------------------------------
    def _open(self) -> None:
        # Known before the worker starts, so the first checkpoint already holds the run id.
        if self.run_id is None:
            self.run_id = self._new_run_id()
        super()._open()

    def _new_run_id(self) -> str:
        util = getattr(self._wandb, "util", None)
        generate = getattr(util, "generate_id", None)
        return str(generate()) if callable(generate) else uuid.uuid4().hex[:8]

    def _start(self, run_id: Optional[str], resume: bool) -> str:
        wandb = self._wandb
        current = getattr(wandb, "run", None)
        if current is not None and (run_id is None or current.id == run_id) and self._run is None:
            self._run, self._owns_run = current, False  # a run the user opened: log into it
        else:
            init: dict[str, Any] = {
                "project": self.project or os.environ.get("WANDB_PROJECT") or "huggingface",
                "entity": self.entity, "name": mask_secrets(self.name or self._run_name_from_args),
                "group": mask_secrets(self.group),
                "tags": self.tags, "mode": self.mode, "dir": self.dir, "id": run_id,
                "resume": self.resume if run_id else None,
            }
            settings = self._safe_settings()
            if settings is not None:
                init["settings"] = settings
            if version_of(wandb) >= (0, 19):
                init["reinit"] = "create_new"
            self._run = wandb.init(**{key: value for key, value in init.items() if value is not None})
            self._owns_run = True
            if not self._exit_hook_registered:  # after W&B's own hook, so it runs first
                atexit.register(self._close_at_exit)
                self._exit_hook_registered = True
        run = self._run
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        self._min_step = int(getattr(run, "starting_step", 0) or 0)
        self._row_step, self._row_keys, self._row_open = max(self._row_step, self._min_step - 1), set(), False
        if self.watch != "false" and self._model is not None:
            watch = getattr(run, "watch", None) or wandb.watch  # Run.watch since wandb 0.18
            watch(self._model, log=self.watch, log_freq=100)
        return str(run.id)

    def _safe_settings(self) -> Any:
        """The user's settings, plus ``x_disable_meta=True`` when the command line holds a secret."""
        return settings_hiding_secret_args(self.settings, self._wandb, sys.argv[1:], self._warn)

    def _close_at_exit(self) -> None:
        try:
            self.close(FAILED if self.training else FINISHED)
        except Exception as error:  # never raise at interpreter exit
            logger.warning("WandbLogger: could not close the run at exit: %s", error)

    def _finish(self, status: str) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        if self._owns_run:
            run.finish(exit_code=0 if status == FINISHED else 1)

    def _logged_steps(self) -> dict[str, int]:
        """Last step per metric the reattached run already holds."""
        steps: dict[str, int] = {}
        run = self._run
        if self._min_step > 0:  # online resume: W&B knows its last step and the summary keys
            for key in list(run.summary.keys()):
                if not key.startswith("_"):
                    steps[key] = self._min_step - 1
        for previous in self._previous_offline_runs():
            from ..testing.wandb_reader import WandbLogFormatError, read_wandb_run

            try:
                history = read_wandb_run(previous).history
            except (OSError, WandbLogFormatError) as error:
                logger.warning("WandbLogger: could not read the earlier offline run %s: %s", previous, error)
                continue
            for row in history:
                step = row.get("_step", -1)
                for key in row:
                    if not key.startswith("_") and key != STEP_KEY:
                        steps[key] = max(steps.get(key, -1), step)
        return steps

    def _previous_offline_runs(self) -> list[Path]:
        run = self._run
        sync_dir = getattr(getattr(run, "settings", None), "sync_dir", None)
        if not sync_dir or not str(getattr(run.settings, "mode", "")).startswith("offline"):
            return []
        current = Path(sync_dir).resolve()
        found = []
        for folder in current.parent.glob(f"offline-run-*-{run.id}*"):
            suffix = folder.name.split(f"-{run.id}", 1)[1]
            if folder.resolve() != current and (suffix == "" or suffix[1:].isdigit()):
                found.extend(folder.glob(f"run-{run.id}.wandb"))
        return found

    # -- sending (worker thread) --------------------------------------------------------------
    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._row_open and step == self._row_step:  # more values for the current row
            fresh = {key: value for key, value in metrics.items() if key not in self._row_keys}
        elif step > self._row_step:  # a new row
            self._row_step, self._row_keys, self._row_open = step, set(), True
            fresh = dict(metrics)
        else:  # the run is past this step: W&B would reject it in the history
            fresh = {}
        if fresh:
            self._run.log({**fresh, STEP_KEY: step}, step=step)
            self._row_keys.update(fresh)
        late = {key: value for key, value in metrics.items() if key not in fresh}
        if late:
            self._run.summary.update(late)
            for key in late:
                self._warn(("late", key), "WandbLogger: %r already has a value at step %d (or the run is "
                           "past that step); W&B keeps one value per key and step, so its history keeps "
                           "the first value and this later one goes to the run summary.", key, step)

    def _log_summary(self, values: dict[str, Any]) -> None:
        self._run.summary.update(values)

    def _log_params(self, params: dict[str, str]) -> None:
        self._run.config.update({key: typed(value) for key, value in params.items()}, allow_val_change=True)

    def _set_tags(self, tags: dict[str, str]) -> None:
        current = list(self._run.tags or ())
        for key, value in tags.items():
            tag = mask_secrets(f"{key}:{value}")[:MAX_TAG_LENGTH]
            if tag not in current:
                current.append(tag)
        self._run.tags = tuple(current)

    def _send(self, batch: list[dict[str, Any]]) -> None:
        chunk: list[dict[str, Any]] = []
        for record in batch:
            if record.get("kind") != "wandb_artifact":
                chunk.append(record)
                continue
            if chunk:
                super()._send(chunk)
                chunk = []
            self._log_artifact(record)
        if chunk:
            super()._send(chunk)

    def _queue_final_model(self, model: Any) -> None:
        folder = tempfile.mkdtemp(prefix="wandb_model_")
        save = getattr(model, "save_pretrained", None)
        if callable(save):
            save(folder)
        else:
            import torch

            torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
        self._worker.submit({"kind": "wandb_artifact", "path": folder, "cleanup": True,
                             "aliases": ["final_model"]})

    def _log_artifact(self, record: dict[str, Any]) -> None:
        folder = Path(record["path"])
        if not folder.is_dir():
            self._warn(("artifact", str(folder)), "WandbLogger: %s no longer exists; not logged as an "
                       "artifact.", folder)
            return
        artifact = self._wandb.Artifact(name=f"model-{self.run_id}", type="model")
        artifact.add_dir(str(folder))
        self._run.log_artifact(artifact, aliases=record["aliases"])
        if record.get("cleanup"):
            shutil.rmtree(folder, ignore_errors=True)
