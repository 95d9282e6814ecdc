"""``WandbLogger``: Weights & Biases through W&B's own service process (docs/loggers_wandb.md)."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .._compat import env_flag, require, version_tuple
from .artifacts import save_model_to_temp
from .base import FINISHED, Backend, LogRecord, WarnOnce, is_main_process, logger
from .config import typed
from .durable import DurableLogger
from .secrets import command_line_has_secret, mask_secrets
from .wandb_files import HistoryTail

__all__ = ["LOG_MODEL_CHOICES", "WATCH_CHOICES", "WandbBackend", "WandbLogger", "wandb_disabled_reason"]

#: Where every logged record still is when W&B did not get it.
_LOG_HISTORY = "every logged record is also in the trainer's state.log_history (trainer_state.json)"
#: Values of ``log_model`` / ``WANDB_LOG_MODEL`` ("true" is transformers' legacy spelling of "end").
LOG_MODEL_CHOICES = ("false", "end", "checkpoint")
_PROJECT_FORBIDDEN = ("/", "\\", "#", "?", "%", ":")
WATCH_CHOICES = ("false", "gradients", "parameters", "all")
RESUME_CHOICES = ("allow", "must")
MODE_CHOICES = ("online", "offline", "disabled", "shared")
STEP_KEY = "train/global_step"
#: Tries of a rewind (``wandb.init(resume_from=...)``), 1 s then 2 s apart.
REWIND_ATTEMPTS = 3


def wandb_disabled_reason(mode: Optional[str] = None) -> Optional[str]:
    """What switches W&B logging off (``WANDB_DISABLED``, ``mode``, ``WANDB_MODE``), or None when it is on."""
    if env_flag("WANDB_DISABLED"):
        return f"WANDB_DISABLED={os.environ['WANDB_DISABLED']!r} is set"
    if mode == "disabled":
        return "mode='disabled' was given"
    if mode is None and os.environ.get("WANDB_MODE", "").strip().lower() == "disabled":
        return "WANDB_MODE='disabled' is set"
    return None


def choice(name: str, value: Any, env: str, default: str, choices: Sequence[str]) -> str:
    """``value`` (else env ``env``, else ``default``) checked against ``choices`` (ValueError naming it)."""
    raw = value if value is not None else os.environ.get(env, default)
    text = str(raw).strip().lower()
    if raw is True or (name == "log_model" and text in ("true", "1")):
        text = "end" if name == "log_model" else "all"
    if text in ("", "0", "none", "no"):
        text = "false"
    if text not in choices:
        source = f"{name}={value!r}" if value is not None else f"{env}={raw!r}"
        raise ValueError(f"WandbLogger: {source} is not valid; choose one of {choices}.")
    return text


def settings_problems(wandb: Any, settings: Any = None) -> list[str]:
    """What W&B's own settings refuse in the ``WANDB_*`` environment and in ``settings`` (a dict): one
    line per problem, naming the variable, its value, why and what to set (W&B raises a raw pydantic
    error at ``wandb.setup``/``wandb.init`` instead)."""
    settings_class = wandb.Settings
    read_env = getattr(settings_class(), "update_from_env_vars", None)  # wandb >= 0.19 (pydantic)
    fields = getattr(settings_class, "model_fields", {})
    problems = []
    for name, value in sorted(os.environ.items()) if callable(read_env) else ():
        if name.startswith("WANDB_"):
            try:
                read_env({name: value})
            except Exception as error:
                detail = error.errors()[0] if callable(getattr(error, "errors", None)) else {}
                key = ".".join(map(str, detail.get("loc", ()))) or "?"
                reason = detail.get("msg") or str(error).splitlines()[0]
                boolean = getattr(fields.get(key), "annotation", None) is bool
                problems.append(f"{name}={value!r} (W&B setting {key!r}: {reason}): set it to "
                                f"{'true or false' if boolean else 'a value W&B accepts'}, or unset it")
    if isinstance(settings, dict):
        try:
            settings_class(**settings)
        except Exception as error:
            problems.append(f"settings={settings!r}: {' '.join(str(error).split())[:300]}")
    return problems


def settings_hiding_secret_args(settings: Any, argv: list[str], warn: Callable[..., None]) -> Any:
    """``settings`` (``wandb.Settings``, a dict or None) plus ``x_disable_meta=True`` when ``argv``
    passes a secret: W&B records the command line in the run's metadata. A value the user set is kept."""
    chosen = settings if isinstance(settings, dict) else getattr(settings, "model_fields_set", ())
    if "x_disable_meta" in chosen or not command_line_has_secret(argv):
        return settings
    if settings is None or isinstance(settings, dict):
        settings = {**(settings or {}), "x_disable_meta": True}
    else:
        settings = settings.model_copy(update={"x_disable_meta": True})
    warn(("argv-secret",), "WandbLogger: the command line passes a secret (a token, password or api key); "
         "W&B's system metadata, which records the command line, is not collected for this run "
         "(x_disable_meta=True). Pass secrets through environment variables to keep the metadata.")
    return settings


class WandbBackend(Backend):
    """One W&B run, on the sender's thread: ``wandb.init``, ``run.log``, ``run.summary``, ``run.config``,
    ``run.finish``.

    Args:
        wandb: The ``wandb`` module.
        init: Keyword arguments of ``wandb.init`` (None values are left out).
        settings: The user's ``wandb.Settings`` (or a dict), or None.
        watch: ``wandb.watch`` mode, or ``"false"``.
        warn: Warns once per key.
    """

    name = "WandbLogger"
    #: W&B's service writes the run's file in the background (32 KiB blocks kept in memory).
    durable_on_answer = False

    def __init__(self, wandb: Any, init: dict[str, Any], settings: Any, watch: str, warn: WarnOnce) -> None:
        self._wandb, self.init, self.settings, self.watch, self._warn = wandb, init, settings, watch, warn
        #: Set at train begin: the model (``watch``) and the display name from ``args.run_name``.
        self.model: Any = None
        self.run_name_from_args: Optional[str] = None
        self.run: Any = None
        self._owns_run = True
        self.new_run()

    def new_run(self, rewind_to: Optional[int] = None) -> None:
        """Start the rows of a run: from scratch, or after row ``rewind_to`` of a resumed run (``start``
        then rewinds the run to that row with ``wandb.init(resume_from=...)``)."""
        self.row = self.position = -1 if rewind_to is None else rewind_to
        self.rewind_to = rewind_to
        self._row_training_step: Optional[int] = None  # the row's train/global_step
        self._row_keys: set[str] = set()
        self._offset = 0  # added to every row: a given run W&B holds rows of (online)
        self._tail: Optional[HistoryTail] = None  # the run file, read on from where it was last read

    def new_run_id(self) -> str:
        """A W&B run id made here (``wandb.init(id=...)``): the first checkpoint names the run."""
        return uuid.uuid4().hex[:8]

    def prepare(self, run_id: Optional[str]) -> None:
        """Start W&B's service now, on the training thread, so its exit hook runs after ours."""
        with contextlib.suppress(Exception):  # a setting W&B refuses after our checks: `start` raises it
            self._wandb.setup()

    def start(self, run_id: Optional[str], run_key: str, resume: bool) -> str:
        """Open the run (rewound to ``rewind_to``), or adopt the run the user opened."""
        wandb, self.run = self._wandb, None
        current = getattr(wandb, "run", None)
        if current is not None and (run_id is None or current.id == run_id):
            self.run, self._owns_run = current, False  # a run the user opened: log into it
            self._opened(rewound=False)
            return str(current.id)
        self._owns_run = True
        init = {**self.init, "name": mask_secrets(self.init.get("name") or self.run_name_from_args),
                "group": mask_secrets(self.init.get("group")), "id": run_id,
                "project": self.init.get("project") or os.environ.get("WANDB_PROJECT") or "huggingface",
                "resume": self.init.get("resume") if run_id else None,
                "settings": settings_hiding_secret_args(self.settings, sys.argv[1:], self._warn),
                "reinit": "create_new" if version_tuple(wandb, 2) >= (0, 19) else None}
        rewind, self.rewind_to = self.rewind_to, None
        failures: list[str] = []
        while rewind is not None and run_id and self.run is None:
            try:  # the rows after the rewind's are the resumed run's
                self.run = self._init({**init, "resume": None, "resume_from": f"{run_id}?_step={rewind}"})
            except Exception as error:  # a killed training's service may hold the run a moment longer
                failures.append(f"{type(error).__name__}: {str(error)[:300]}")
                if len(failures) == REWIND_ATTEMPTS:  # online: the run never reached W&B's server
                    logger.warning("WandbLogger: could not rewind run %s to step %d (%s); continuing it "
                                   "without rewinding.", run_id, rewind, "; ".join(failures))
                    rewind = None
                time.sleep(len(failures))
        if self.run is None:
            self.run = self._init(init)
        self._opened(rewound=rewind is not None)
        return str(self.run.id)

    def _init(self, init: dict[str, Any]) -> Any:
        """``wandb.init`` of the given arguments, with a copy of the settings (W&B fills in the object)."""
        given = {key: value for key, value in init.items() if value is not None}
        if "settings" in given:
            given["settings"] = copy.copy(given["settings"])
        return self._wandb.init(**given)

    def _opened(self, rewound: bool) -> None:
        run = self.run
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        if not rewound:  # a run W&B already holds rows of (online, given by id): log after them
            self._offset = int(getattr(run, "starting_step", 0) or 0)
        if self.watch != "false" and self.model is not None:
            watch = getattr(run, "watch", None) or self._wandb.watch  # Run.watch since wandb 0.18
            watch(self.model, log=self.watch, log_freq=100)

    def place(self, record: LogRecord, position: Optional[int] = None) -> int:
        """A record's curves go to a history row: the row of its training step while no key repeats there,
        else the next row (``train/global_step``, every chart's x axis, still its step)."""
        if record.metrics:
            step = record.step
            if step != self._row_training_step or not self._row_keys.isdisjoint(record.metrics):
                self.row = max(step, self.row + 1)
                self._row_training_step, self._row_keys = step, set()
            self._row_keys.update(record.metrics)
        record.position = self.position = self.row
        return self.row

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """Each record's curves into its history row, its totals into the summary."""
        for record in records:
            if record.metrics:
                self.run.log({**record.metrics, STEP_KEY: record.step}, step=record.position + self._offset)
            if record.summary:
                self.run.summary.update(record.summary)

    def confirm_durable(self) -> Optional[int]:
        """The last history row W&B's service wrote to the run's file (it keeps 32 KiB blocks in memory)."""
        path = getattr(getattr(self.run, "settings", None), "sync_file", None)
        if not self._owns_run or not path:
            return None
        if self._tail is None or str(self._tail.path) != str(path):  # a new run, or a rewound one
            self._tail = HistoryTail(path)
        step = self._tail.read()
        return None if step is None else step - self._offset

    def rewind(self, position: int) -> None:
        """The resumed run's rows follow row ``position`` (``wandb.init(resume_from=...)``)."""
        self.new_run(position)

    def log_config(self, params: dict[str, str], run_id: str) -> None:
        self.run.config.update({key: typed(value) for key, value in params.items()}, allow_val_change=True)

    def log_file(self, folder: str, name: str, kind: str, run_id: str) -> None:
        if not Path(folder).is_dir():
            self._warn(("artifact", folder), "WandbLogger: %s no longer exists; not logged as an artifact.",
                       folder)
            return
        artifact = self._wandb.Artifact(name=f"{kind}-{self.run.id}", type=kind)
        artifact.add_dir(folder)  # copies the files: the staged folder can go
        self.run.log_artifact(artifact, aliases=[name])
        shutil.rmtree(folder, ignore_errors=True)

    def location(self) -> str:
        """The run's folder (W&B's ``sync_dir``), or the W&B directory before it is open."""
        sync_dir = getattr(getattr(self.run, "settings", None), "sync_dir", None)
        return str(sync_dir or self.init.get("dir") or os.environ.get("WANDB_DIR") or "./wandb")

    def finish(self, status: str, run_id: str) -> None:
        """Finish the run with exit code 0 or 1 (a run the user opened is left to the user)."""
        run, self.run = self.run, None
        if run is not None and self._owns_run:
            run.finish(exit_code=0 if status == FINISHED else 1)


class WandbLogger(DurableLogger):
    """Logs to Weights & Biases through its own service process; one run per training, resumable.

    Args:
        project: W&B project. Defaults to ``WANDB_PROJECT``, else ``"huggingface"`` (like ``WandbCallback``).
        entity: W&B entity (team or user). Defaults to W&B's own (``WANDB_ENTITY``).
        run_id: Run id to log to (an existing run is continued). Defaults to ``WANDB_RUN_ID``, else the
            id saved in the checkpoint being resumed, else a new id.
        name: Display name. Defaults to ``TrainingArguments.run_name`` when it is set and differs from
            ``output_dir``, else W&B's generated name.
        tags: Run tags. Defaults to None (W&B also reads ``WANDB_TAGS``).
        group: Run group. Defaults to None.
        log_model: ``"false"``, ``"end"`` (the final model as an artifact) or ``"checkpoint"`` (every
            saved checkpoint as an artifact). Defaults to ``WANDB_LOG_MODEL``, else ``"false"``.
        watch: ``wandb.watch`` the model: ``"false"``, ``"gradients"``, ``"parameters"`` or ``"all"``.
            Defaults to ``WANDB_WATCH``, else ``"false"``.
        mode: ``"online"``, ``"offline"``, ``"disabled"`` or ``"shared"``. Defaults to ``WANDB_MODE``.
        resume: How a run id from a checkpoint or ``run_id`` is reattached: ``"allow"`` (continue it,
            or create it) or ``"must"`` (fail when it does not exist). Defaults to "allow".
        dir: Directory W&B writes its files to. Defaults to ``WANDB_DIR``, else the working directory.
        settings: Extra ``wandb.Settings`` (or a dict of them). Defaults to None. When the command line
            holds a secret, ``x_disable_meta=True`` is added unless you set it.
        **kwargs: Options of `TrackerLogger` (``flush_timeout``: the longest wait for ``wandb.init``
            and ``run.finish`` at the end...).

    Raises:
        ModuleNotFoundError: ``wandb`` is not installed (``hf-callbacks-plus[wandb]``); not when disabled.
        ValueError: An argument or environment variable has an invalid value.
    """

    stock_callback = "WandbCallback"
    stock_key_style = "rewrite_logs"
    stock_summary_keys = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                                    "train_loss", "total_flos"})
    max_param_length = 10_000
    #: The exception waits for ``wandb.init`` (seconds on a busy machine) so the run gets its status.
    exception_timeout = 20.0
    close_at_train_end = False

    def __init__(self, project: Optional[str] = None, entity: Optional[str] = None,
                 run_id: Optional[str] = None, name: Optional[str] = None,
                 tags: Optional[Sequence[str]] = None, group: Optional[str] = None,
                 log_model: Optional[str] = None, watch: Optional[str] = None,
                 mode: Optional[str] = None, resume: str = "allow", dir: Optional[str] = None,
                 settings: Any = None, **kwargs: Any) -> None:
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
            source = "" if project is not None else " (from WANDB_PROJECT)"
            raise ValueError(f"WandbLogger: project={chosen_project!r}{source} is not a valid W&B project "
                             f"name: it may not contain any of {' '.join(_PROJECT_FORBIDDEN)}. For "
                             "'team/project' pass entity='team', project='project'.")
        self.project, self.entity, self.name, self.group = project, entity, name, group
        self.tags = [mask_secrets(tag) for tag in tags] if tags is not None else None
        self.mode, self.resume, self.dir, self.settings = mode, resume, dir, settings
        self.log_model = choice("log_model", log_model, "WANDB_LOG_MODEL", "false", LOG_MODEL_CHOICES)
        self.watch = choice("watch", watch, "WANDB_WATCH", "false", WATCH_CHOICES)
        self._given = {"log_model": log_model, "watch": watch}  # state_args: the arguments, not the env
        self.explicit_run_id = run_id or os.environ.get("WANDB_RUN_ID") or None
        #: Why the logger does nothing (``WANDB_DISABLED``, ``mode="disabled"``), or None.
        self.disabled_reason = wandb_disabled_reason(mode)
        self._wandb: Any = None
        if self.disabled_reason is not None:
            logger.warning("WandbLogger is disabled because %s: nothing will be logged to W&B. "
                           "Unset it to log.", self.disabled_reason)
            return
        self._wandb = require("wandb", "WandbLogger")
        self.check_settings()
        self.backend: Optional[WandbBackend] = WandbBackend(self._wandb, self._init_kwargs(), settings,
                                                            self.watch, self.warn)

    def _init_kwargs(self) -> dict[str, Any]:
        return {"project": self.project, "entity": self.entity, "name": self.name, "group": self.group,
                "tags": self.tags, "mode": self.mode, "dir": self.dir, "resume": self.resume}

    def check_settings(self) -> None:
        """Raise ``ValueError`` naming every ``WANDB_*`` variable (and ``settings`` entry) W&B refuses, with
        what to set (at construction and again at train begin: the environment may have changed)."""
        problems = settings_problems(self._wandb, self.settings)
        if problems:
            raise ValueError("WandbLogger: W&B refuses its settings, so no run could open: "
                             + "; ".join(problems) + ".")

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
        return {**self._init_kwargs(), **self._given}

    # -- events (no-ops when disabled: no backend) ---------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Restore the run id from the checkpoint, open the run on the sender's thread and wait for it at
        most ``flush_timeout`` seconds, as ``WandbCallback`` waits for ``wandb.init``."""
        if self.backend is None:
            return
        backend = self.backend
        backend.init, backend.settings, backend.watch = self._init_kwargs(), self.settings, self.watch
        backend.model = model
        run_name = getattr(args, "run_name", None)
        from_args = run_name and run_name != getattr(args, "output_dir", None)
        backend.run_name_from_args = run_name if from_args else None
        if is_main_process(state):
            self.check_settings()
        super().on_train_begin(args, state, control, model=model, **kwargs)
        if self._sender is not None:  # beside a running training, wandb.init costs more CPU (the GIL)
            self._sender.wait_open(self.flush_timeout)

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """The base's; a checkpoint of 0.2 names its last row ``wandb_step`` (0.2.0: its last step)."""
        steps = attributes.get("last_steps") or {}
        legacy = attributes.get("wandb_step", max(steps.values()) if steps else None)
        super().load_state_attributes({"position": legacy, **attributes})

    def _open_run(self, resume: bool, boundary: bool) -> None:
        """The rows of the run a ``train()`` opens start from scratch (a resume rewinds them)."""
        if self._session_start:
            self.backend.new_run()
        super()._open_run(resume, boundary)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """With ``log_model="checkpoint"``, upload the checkpoint folder as a model artifact."""
        super().on_save(args, state, control, **kwargs)
        if self.backend is not None and self.log_model == "checkpoint":
            self.log_file(Path(args.output_dir) / f"checkpoint-{state.global_step}",
                          f"checkpoint_global_step_{state.global_step}", "model")

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Upload the final model (``log_model="end"``); the run stays open, as with ``WandbCallback``, for
        ``evaluate()``/``predict()`` after training, and is finished (exit code 0) at exit, by the next
        ``train()`` or by `close` (reopened offline, it would be a second folder)."""
        if self.backend is None:
            return
        if self.log_model == "end" and self._is_open and model is not None:
            self._write_file(save_model_to_temp(model, "wandb_model_"), "final_model", "model")
        super().on_train_end(args, state, control, **kwargs)
        sender = self._sender
        if self._is_open and sender is not None and sender.start_error is not None:
            self.close(FINISHED)  # no run to keep open: tell what is not in W&B now
