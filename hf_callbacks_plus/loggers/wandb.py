"""``WandbLogger``: Weights & Biases logging that never blocks training and reattaches on resume.

A thin adapter over W&B's own background machinery: ``run.log`` hands each record to W&B's
service process, which writes it to the run's own log (``run-<id>.wandb``) and uploads it,
riding out network outages (``wandb sync`` uploads what an interrupted process left); nothing of
ours queues, retries or spills W&B records. ``wandb.init`` and ``run.finish``, which take
seconds, run on a thread of their own, bounded by ``flush_timeout``. On top of `TrackerLogger`
(key grammar, value normalization, redacted config, rank zero, checkpointed run id):

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
  of the same id, read with `read_wandb_run` of `hf_callbacks_plus.loggers.wandb_runfile`);
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

import logging
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .._compat import env_flag, require, version_tuple
from .artifacts import stage_folder
from .backend import FINISHED, Backend
from .base import TrackerLogger, save_model_to_temp
from .records import ArtifactRecord, LogRecord, WarnOnce
from .secrets import command_line_has_secret, mask_secrets
from .wandb_runfile import WandbLogFormatError, WandbRun, read_wandb_run

__all__ = ["LOG_MODEL_CHOICES", "WATCH_CHOICES", "WandbBackend", "WandbLogger", "wandb_disabled_reason"]

logger = logging.getLogger("hf_callbacks_plus")


#: Values of ``log_model`` / ``WANDB_LOG_MODEL`` ("true" is transformers' legacy spelling of "end").
LOG_MODEL_CHOICES = ("false", "end", "checkpoint")
#: Characters W&B refuses in a project name.
_PROJECT_FORBIDDEN = ("/", "\\", "#", "?", "%", ":")
#: Values of ``watch`` / ``WANDB_WATCH``.
WATCH_CHOICES = ("false", "gradients", "parameters", "all")
RESUME_CHOICES = ("allow", "must")
MODE_CHOICES = ("online", "offline", "disabled", "shared")
STEP_KEY = "train/global_step"
MAX_TAG_LENGTH = 64


def wandb_disabled_reason(mode: Optional[str] = None) -> Optional[str]:
    """Why W&B logging is switched off, or None when it is on.

    Args:
        mode: The ``mode`` argument given to the logger. Defaults to None (environment only).

    Returns:
        A sentence naming the setting that disables W&B, or None.
    """
    if env_flag("WANDB_DISABLED"):
        return f"WANDB_DISABLED={os.environ['WANDB_DISABLED']!r} is set"
    if mode == "disabled":
        return "mode='disabled' was given"
    if mode is None and os.environ.get("WANDB_MODE", "").strip().lower() == "disabled":
        return "WANDB_MODE='disabled' is set"
    return None


def choice(name: str, value: Any, env: str, default: str, choices: Sequence[str]) -> str:
    """Validate ``value`` (else the environment variable ``env``, else ``default``) against ``choices``.

    Raises:
        ValueError: Not one of ``choices``; the message names the argument or variable.
    """
    raw = value if value is not None else os.environ.get(env, default)
    if isinstance(raw, bool):
        raw = "end" if (raw and name == "log_model") else ("all" if raw else "false")
    text = str(raw).strip().lower()
    if name == "log_model" and text in ("true", "1"):
        text = "end"
    if text in ("", "0", "none", "no"):
        text = "false"
    if text not in choices:
        source = f"{name}={value!r}" if value is not None else f"{env}={raw!r}"
        raise ValueError(f"WandbLogger: {source} is not valid; choose one of {choices}.")
    return text


def typed(value: str) -> Any:
    """Config values arrive as strings; give numbers and booleans back their type."""
    if value in ("True", "False"):
        return value == "True"
    if value == "None":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def settings_hiding_secret_args(settings: Any, wandb: Any, argv: list[str], warn: Callable[..., None]) -> Any:
    """``settings`` plus ``x_disable_meta=True`` when ``argv`` passes a secret.

    W&B writes the command line (``sys.argv``) into the run metadata, which lands in the run
    files; ``x_disable_meta`` is the wandb setting that stops collecting it (with the rest of the
    system metadata). A value you set for ``x_disable_meta`` yourself is kept.

    Args:
        settings: The user's ``wandb.Settings``, a dict of settings, or None.
        wandb: The ``wandb`` module.
        argv: The command-line arguments (``sys.argv[1:]``).
        warn: A `WarnOnce`.

    Returns:
        The settings to give ``wandb.init`` (None when there is nothing to set).
    """
    if not command_line_has_secret(argv):
        return settings
    if isinstance(settings, dict):
        if "x_disable_meta" in settings:
            return settings
        settings = {**settings, "x_disable_meta": True}
    elif settings is None:
        settings = wandb.Settings(x_disable_meta=True)
    elif "x_disable_meta" in getattr(settings, "model_fields_set", ()):
        return settings
    else:
        settings = settings.model_copy(update={"x_disable_meta": True})
    warn(("argv-secret",), "WandbLogger: the command line passes a secret (a token, password or api key); "
         "W&B's system metadata, which records the command line, is not collected for this run "
         "(x_disable_meta=True). Pass secrets through environment variables to keep the metadata.")
    return settings


#: Seconds to wait for an earlier offline run file that looks incomplete to be flushed.
_FLUSH_WAIT = 3.0


def _offline_damage(run: WandbRun, resume_step: Optional[int]) -> Optional[str]:
    """What is wrong with an earlier offline run file of a resumed run, or None when it is whole.

    A run file that was finished (exit record) is whole. One that was not was left by a
    process that died: W&B's service had not written (all of) its records.
    """
    if run.finished:
        return None
    size = run.path.stat().st_size if run.path.exists() else 0
    if not run.history:
        return f"holds no history rows ({run.path.name} is {size} bytes, no exit record)"
    last = max(row.get("_step", -1) for row in run.history)
    if run.truncated:
        return f"ends in the middle of a record after step {last} (no exit record)"
    if resume_step is not None and last < resume_step:
        return f"holds history only up to step {last} (no exit record)"
    return None


class WandbBackend(Backend):
    """One W&B run: ``wandb.init`` / ``run.log`` / ``run.summary`` / ``run.config`` / ``run.finish``.

    W&B keeps one value per key and step: a later value of a key already in the current step's
    row, or a value at a step the run is already past, goes to ``run.summary``, with one warning
    per key.

    Args:
        wandb: The ``wandb`` module.
        init: Keyword arguments of ``wandb.init`` (None values are left out).
        settings: The user's ``wandb.Settings`` (or a dict), or None.
        watch: ``wandb.watch`` mode, or ``"false"``.
        warn: Warns once per key.
    """

    name = "WandbLogger"
    buffers_itself = True
    opens_slowly = True
    stock_key_style = "rewrite_logs"
    stock_summary_keys = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                                    "train_loss", "total_flos"})
    max_param_length = 10_000

    def __init__(self, wandb: Any, init: dict[str, Any], settings: Any, watch: str, warn: WarnOnce) -> None:
        self._wandb = wandb
        self.init = init
        self.settings = settings
        self.watch = watch
        self._warn = warn
        #: Set at train begin: the model (``watch``) and the display name from ``args.run_name``.
        self.model: Any = None
        self.run_name_from_args: Optional[str] = None
        self.run: Any = None
        self._owns_run = True
        self._min_step = 0
        self.new_session()

    def new_session(self) -> None:
        """Forget the rows of an earlier ``train()`` (called at train begin)."""
        self._row_step = -1  # step of the last history row written in this session
        self._row_keys: set[str] = set()
        self._row_open = False  # the row at _row_step was written by the open run

    def prepare_process(self) -> None:
        """Start W&B's service now, on the training thread: its exit hook is registered before
        the logger's, so the logger's runs first (closing the run with the right exit code)."""
        setup = getattr(self._wandb, "setup", None)
        if callable(setup):
            setup()

    def new_run_id(self) -> str:
        """A W&B run id, made on the training thread when the run is opened (``wandb.init(id=...)``
        takes it), so the first checkpoint names the run however long ``wandb.init`` takes."""
        util = getattr(self._wandb, "util", None)
        generate = getattr(util, "generate_id", None)
        return str(generate()) if callable(generate) else uuid.uuid4().hex[:8]

    def start(self, run_id: Optional[str], resume: bool, run_key: Optional[str] = None) -> str:
        wandb = self._wandb
        current = getattr(wandb, "run", None)
        if current is not None and (run_id is None or current.id == run_id) and self.run is None:
            self.run, self._owns_run = current, False  # a run the user opened: log into it
        else:
            init = {**self.init, "name": mask_secrets(self.init.get("name") or self.run_name_from_args),
                    "group": mask_secrets(self.init.get("group")), "id": run_id,
                    "project": self.init.get("project") or os.environ.get("WANDB_PROJECT") or "huggingface",
                    "resume": self.init.get("resume") if run_id else None}
            settings = settings_hiding_secret_args(self.settings, wandb, sys.argv[1:], self._warn)
            if settings is not None:
                init["settings"] = settings
            if version_tuple(wandb, 2) >= (0, 19):
                init["reinit"] = "create_new"
            self.run = wandb.init(**{key: value for key, value in init.items() if value is not None})
            self._owns_run = True
        run = self.run
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        self._min_step = int(getattr(run, "starting_step", 0) or 0)
        self._row_step, self._row_keys, self._row_open = max(self._row_step, self._min_step - 1), set(), False
        if self.watch != "false" and self.model is not None:
            watch = getattr(run, "watch", None) or wandb.watch  # Run.watch since wandb 0.18
            watch(self.model, log=self.watch, log_freq=100)
        return str(run.id)

    def finish(self, status: str, run_id: str) -> None:
        run, self.run = self.run, None
        if run is not None and self._owns_run:
            run.finish(exit_code=0 if status == FINISHED else 1)

    def logged_steps(self, run_id: str) -> dict[str, int]:
        """Last step per metric the reattached run already holds."""
        steps: dict[str, int] = {}
        run = self.run
        if self._min_step > 0:  # online resume: W&B knows its last step and the summary keys
            for key in list(run.summary.keys()):
                if not key.startswith("_"):
                    steps[key] = self._min_step - 1
        damaged: list[tuple[Path, str]] = []
        for previous in self._previous_offline_runs():
            try:
                earlier = read_wandb_run(previous)
                if _offline_damage(earlier, self.resume_step) is not None:
                    # a run finished just now (in this process) may not be flushed yet: wait a little
                    earlier = read_wandb_run(previous, wait=_FLUSH_WAIT)
            except (OSError, WandbLogFormatError) as error:
                damaged.append((previous, f"cannot be read ({error})"))
                continue
            for row in earlier.history:
                step = row.get("_step", -1)
                for key in row:
                    if not key.startswith("_") and key != STEP_KEY:
                        steps[key] = max(steps.get(key, -1), step)
            problem = _offline_damage(earlier, self.resume_step)
            if problem is not None:
                damaged.append((previous, problem))
        for previous, problem in damaged:
            self._tell_lost_offline_data(previous, problem, steps)
        return steps

    def _tell_lost_offline_data(self, previous: Path, problem: str, steps: dict[str, int]) -> None:
        """One warning per earlier offline folder of this run whose process died before W&B
        wrote its data: which folder, what is lost, and what this resumed run holds."""
        held = max(steps.values(), default=-1)
        checkpoint = self.resume_step
        lost = (f"the W&B data of the steps up to the checkpoint (step {checkpoint})" if checkpoint
                else "the W&B data that process logged")
        holds = (f"W&B history up to step {held}" if held >= 0 else "no W&B history")
        current = getattr(getattr(self.run, "settings", None), "sync_dir", None)
        self._warn(("lost-offline", str(previous)),
                   "WandbLogger: the earlier offline folder %s of run %s %s: the process writing it ended "
                   "without W&B writing its records (killed?), so %s is lost or incomplete there (`wandb "
                   "sync` of that folder cannot bring it back). This run (%s) logs %s; the offline "
                   "folders of this run hold %s before it.",
                   previous.parent, getattr(self.run, "id", "?"), problem, lost, current or "a new folder",
                   f"the steps after the checkpoint's step {checkpoint}" if checkpoint else "from the start",
                   holds)

    def _previous_offline_runs(self) -> list[Path]:
        run = self.run
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

    def log(self, records: list[LogRecord], run_id: str) -> None:
        for record in records:
            if record.metrics:
                self._log_row(record.metrics, record.step)
            if record.summary:
                self.run.summary.update(record.summary)

    def _log_row(self, metrics: dict[str, float], step: int) -> None:
        if self._row_open and step == self._row_step:  # more values for the current row
            fresh = {key: value for key, value in metrics.items() if key not in self._row_keys}
        elif step > self._row_step:  # a new row
            self._row_step, self._row_keys, self._row_open = step, set(), True
            fresh = metrics
        else:  # the run is past this step: W&B would reject it in the history
            fresh = {}
        if fresh:
            self.run.log({**fresh, STEP_KEY: step}, step=step)
            self._row_keys.update(fresh)
        late = {} if fresh is metrics else {key: value for key, value in metrics.items() if key not in fresh}
        if late:
            self.run.summary.update(late)
            for key in late:
                self._warn(("late", key), "WandbLogger: %r already has a value at step %d (or the run is "
                           "past that step); W&B keeps one value per key and step, so its history keeps "
                           "the first value and this later one goes to the run summary.", key, step)

    def store_config(self, params: dict[str, str], run_id: str) -> None:
        self.run.config.update({key: typed(value) for key, value in params.items()}, allow_val_change=True)

    def set_tags(self, tags: dict[str, str], run_id: str) -> None:
        current = list(self.run.tags or ())
        for key, value in tags.items():
            tag = mask_secrets(f"{key}:{value}")[:MAX_TAG_LENGTH]
            if tag not in current:
                current.append(tag)
        self.run.tags = tuple(current)

    def location(self) -> str:
        """The run's folder (W&B's ``sync_dir``), or the W&B directory before it is open."""
        sync_dir = getattr(getattr(self.run, "settings", None), "sync_dir", None)
        return str(sync_dir or self.init.get("dir") or os.environ.get("WANDB_DIR") or "./wandb")

    def log_artifact(self, record: ArtifactRecord, run_id: str) -> None:
        folder = Path(record.path)
        if not folder.is_dir():
            self._warn(("artifact", str(folder)), "WandbLogger: %s no longer exists; not logged as an "
                       "artifact.", folder)
            return
        kind = record.artifact_type
        artifact = self._wandb.Artifact(name=f"{kind}-{run_id}", type=kind)
        artifact.add_dir(str(folder))
        self.run.log_artifact(artifact, aliases=record.aliases)
        if record.cleanup:
            shutil.rmtree(folder, ignore_errors=True)


class WandbLogger(TrackerLogger):
    """Logs to Weights & Biases through its own service process; one run per training, resumable.

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
        **kwargs: Options of `TrackerLogger` (``log_config``, ``nonfinite``, ``flush_timeout``:
            the longest wait for ``wandb.init`` and ``run.finish`` at the end, ``max_memory_points``:
            the records kept while ``wandb.init`` runs...).

    Raises:
        ModuleNotFoundError: ``wandb`` is not installed (install ``hf-callbacks-plus[wandb]``).
            Not raised when W&B is disabled: the logger is then a no-op.
        ValueError: An argument or environment variable has an invalid value.

    Example:
        >>> from hf_callbacks_plus import WandbLogger
        >>> trainer = Trainer(..., args=TrainingArguments(..., report_to="none"),  # doctest: +SKIP
        ...                   callbacks=[WandbLogger(project="my-project")])
    """

    stock_callback = "WandbCallback"

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
        chosen_project = project if project is not None else os.environ.get("WANDB_PROJECT")
        if chosen_project is not None and any(char in str(chosen_project) for char in _PROJECT_FORBIDDEN):
            raise ValueError(
                f"WandbLogger: project={chosen_project!r}"
                f"{'' if project is not None else ' (from WANDB_PROJECT)'} is not a valid W&B project name: "
                f"it may not contain any of {' '.join(_PROJECT_FORBIDDEN)}. For 'team/project' pass "
                "entity='team', project='project'."
            )
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
        if self.disabled_reason is not None:
            logger.warning("WandbLogger is disabled because %s: nothing will be logged to W&B. "
                           "Unset it to log.", self.disabled_reason)
            return
        self._wandb = require("wandb", "WandbLogger")
        self.backend: Optional[WandbBackend] = WandbBackend(self._wandb, self._init_kwargs(), settings,
                                                            self.watch, self._warn)

    def _init_kwargs(self) -> dict[str, Any]:
        return {"project": self.project, "entity": self.entity, "name": self.name, "group": self.group,
                "tags": self.tags, "mode": self.mode, "dir": self.dir, "resume": self.resume}

    @property
    def disabled(self) -> bool:
        """True when W&B is disabled; every event is then a no-op."""
        return self.disabled_reason is not None

    @property
    def run(self) -> Any:
        """The ``wandb`` run being logged to (None until ``wandb.init`` returned)."""
        return None if self.backend is None else self.backend.run

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger (the run id is in the attributes)."""
        return {"project": self.project, "entity": self.entity, "name": self.name, "tags": self.tags,
                "group": self.group, "log_model": self._given["log_model"], "watch": self._given["watch"],
                "mode": self.mode, "resume": self.resume, "dir": self.dir}

    # -- events (no-ops when disabled: no backend) ---------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Restore the run id from the checkpoint, start the run in the background."""
        if self.backend is None:
            return
        backend = self.backend
        backend.init, backend.settings, backend.watch = self._init_kwargs(), self.settings, self.watch
        backend.model = model
        run_name = getattr(args, "run_name", None)
        from_args = run_name and run_name != getattr(args, "output_dir", None)
        backend.run_name_from_args = run_name if from_args else None
        backend.new_session()
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """With ``log_model="checkpoint"``, queue the checkpoint folder as a model artifact."""
        super().on_save(args, state, control, **kwargs)
        if self.backend is None or self.log_model != "checkpoint" or self._worker is None:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        staged = stage_folder(folder, Path(args.output_dir) / ".tracker_artifacts")  # no training_args.bin
        if staged is not None:
            self._worker.submit(ArtifactRecord(str(staged), [f"checkpoint_global_step_{state.global_step}"],
                                               cleanup=True))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Queue the final model (``log_model="end"``), flush and finish the run (exit code 0)."""
        if self.backend is None:
            return
        if self.log_model == "end" and self._worker is not None and model is not None:
            self._queue_final_model(model)
        super().on_train_end(args, state, control, **kwargs)

    def _queue_final_model(self, model: Any) -> None:
        folder = save_model_to_temp(model, "wandb_model_")
        self._worker.submit(ArtifactRecord(folder, ["final_model"], cleanup=True))
