"""``MLflowLogger``: MLflow through ``MlflowClient``, every record through a write-ahead log (wal.py)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sqlite3
import sys
import time
from contextlib import closing
from operator import itemgetter
from pathlib import Path
from typing import Any, Optional

from .._compat import env_flag, require
from .artifacts import save_model_to_temp
from .base import Backend, LogRecord, WarnOnce
from .durable import DurableLogger
from .mlflow_helper import (
    HelperEnded,
    Store,
    StoreHelper,
    explain_mlflow_error,
    is_transient_mlflow_error,
    store_is_made,
)
from .secrets import mask_secrets, mask_url_credentials, remember_credentials, unmask_url

__all__ = ["LOG_ARTIFACTS_CHOICES", "RUN_KEY_TAG", "MLflowBackend", "MLflowLogger", "UnusableRunError",
           "explain_mlflow_error", "is_transient_mlflow_error", "validate_tracking_uri"]

LOG_ARTIFACTS_CHOICES = ("false", "checkpoint", "end", "all")
#: Tag holding the client-made run key: a resume finds the run by it.
RUN_KEY_TAG = "hf_callbacks_plus.run_key"
_BAD_NAME_CHARS = re.compile(r"[^/\w.\- :]")


class UnusableRunError(ValueError):
    """The run to reattach to does not exist or is deleted: a misconfiguration, never retried."""


def validate_tracking_uri(uri: Optional[str]) -> Optional[str]:
    """Check a tracking URI (scheme, file store, sqlite path); return it unchanged.

    Raises:
        ValueError: The URI cannot work (an unknown scheme, a file store the installed mlflow refuses, a
            sqlite database that cannot be created, or one left half-made); the message names it.
        TypeError: ``uri`` is not a string.
    """
    if uri is None or uri == "":
        return None
    if not isinstance(uri, str):
        raise TypeError(f"tracking_uri must be a str, got {type(uri).__name__}: {uri!r}")
    store, refused = Store.parse(uri), f"tracking_uri (or MLFLOW_TRACKING_URI) {uri!r}"
    if store.kind == "file":
        from mlflow import environment_variables

        allowed = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
        if allowed is not None and not allowed.get():  # None: an mlflow that still takes file stores
            raise ValueError(f"{refused} is a file store, which the installed mlflow refuses. Use a database "
                             "store, e.g. tracking_uri='sqlite:///mlflow.db', or set "
                             "MLFLOW_ALLOW_FILE_STORE=true to keep the file store.")
    elif store.kind == "sqlite":
        for module in ("sqlalchemy", "alembic"):  # not in mlflow-skinny: said now, not after training
            require(module, f"MLflowLogger(tracking_uri={uri!r}) (a local sqlite store)")
        folder = os.path.dirname(store.path)
        while not os.path.exists(folder):
            folder = os.path.dirname(folder)
        problem = ("is a directory" if os.path.isdir(store.path) else
                   f"cannot be created: {folder!r} is a file, not a folder" if not os.path.isdir(folder) else
                   f"cannot be created: the folder {folder!r} is not writable"
                   if not os.access(folder, os.W_OK | os.X_OK) else None)
        if problem is not None:
            raise ValueError(f"{refused}: the sqlite database {store.path!r} {problem}. Use a path in a "
                             "writable folder, e.g. tracking_uri='sqlite:///mlflow.db' (relative to the "
                             "working directory) or 'sqlite:////absolute/path/mlflow.db'.")
        _refuse_half_made_sqlite(refused, store)
    elif store.kind == "remote":  # a scheme MLflow's own registry of stores (plugins' included) lacks
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        try:
            _tracking_store_registry.get_store_builder(uri)
        except Exception as error:  # MLflow's UnsupportedModelRegistryStoreURIException
            valid = ", ".join(filter(None, getattr(error, "supported_uri_schemes", ())))
            raise ValueError(f"{refused} has an unknown scheme {store.scheme!r}. " + (
                f"Valid schemes: {valid}, or a local path." if valid else str(error))) from error
    return uri


def _refuse_half_made_sqlite(refused: str, store: Store) -> None:
    """Refuse, with the repair, a sqlite store a process left while creating or upgrading its tables."""
    try:
        with closing(sqlite3.connect(f"file:{store.path}?mode=ro", uri=True, timeout=1.0)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            left = sorted(name for name in tables if name.startswith("_alembic_tmp_"))
            runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if left and "runs" in tables else 0
    except sqlite3.Error:  # not there, locked, not a database: MLflow says so when it opens it
        return
    if not left:
        return
    repair = "; ".join(f"DROP TABLE {name}" if name[len("_alembic_tmp_"):] in tables else
                       f"ALTER TABLE {name} RENAME TO {name[len('_alembic_tmp_'):]}" for name in left)
    fix = ("it holds no runs: delete the file and MLflowLogger creates it again" if not runs else
           f"it holds {runs} run(s): back it up, run `sqlite3 {store.path} '{repair}'`, then "
           f"`mlflow db upgrade {store.uri}`")
    raise ValueError(f"{refused}: the sqlite database {store.path!r} was left half-made by a process that "
                     "ended while creating or upgrading its tables "
                     f"({', '.join(left)} left over), and MLflow cannot open it. To repair it: {fix}.")


def parse_tags_env() -> dict[str, str]:
    """``MLFLOW_TAGS`` as a dict, secrets masked (``ValueError`` when it is not a JSON object)."""
    raw = os.environ.get("MLFLOW_TAGS")
    try:
        tags = json.loads(raw) if raw else {}
    except json.JSONDecodeError as error:
        tags = error
    if not isinstance(tags, dict):
        raise ValueError(f"MLFLOW_TAGS must be a JSON object such as '{{\"team\": \"nlp\"}}', got {raw!r} "
                         f"({tags if isinstance(tags, Exception) else type(tags).__name__}).")
    return {str(key): mask_secrets(str(value)) for key, value in tags.items()}


def clean_mlflow_name(name: str) -> str:
    """Replace characters MLflow rejects with ``_`` and drop empty path parts."""
    cleaned = _BAD_NAME_CHARS.sub("_", name)
    parts = [part if part not in (".", "..") else "_" for part in cleaned.split("/") if part]
    return "/".join(parts) or "_"


class MLflowBackend(Backend):
    """One MLflow store through ``MlflowClient``.

    Args:
        tracking_uri: Where to log (None: MLflow's default, read now).
        experiment_name: Experiment, created when missing (None: the default experiment).
        run_name: Name of a new run. Defaults to None (MLflow's generated name).
        tags: Tags of the run. Defaults to None.
        warn: Warns once per key. Defaults to a new `WarnOnce`.
        helper: Write a store MLflow writes in this process (sqlite, another database, a file store) from
            a helper process when a call holds at least one full batch, once such calls have taken a
            second here (`mlflow_helper`): a training keeps the GIL. Defaults to True (``replay``, which
            does nothing else, passes False). A new store is made by a helper process either way.
    """

    name = "MLflowLogger"
    #: One ``log_batch`` per second at most, unless a full call waits (a sqlite store commits per call).
    send_interval = 1.0

    def __init__(self, tracking_uri: Optional[str], experiment_name: Optional[str],
                 run_name: Optional[str] = None, tags: Optional[dict[str, str]] = None,
                 warn: Optional[WarnOnce] = None, helper: bool = True) -> None:
        self.store = Store.parse(tracking_uri or require("mlflow", "MLflowLogger").get_tracking_uri())
        self.experiment_name, self.run_name = experiment_name, run_name
        self.tags, self._warn = dict(tags or {}), warn or WarnOnce()
        from mlflow.utils import validation

        self.max_tag_length: int = validation.MAX_TAG_VAL_LENGTH
        self.max_metrics_per_batch: int = validation.MAX_METRICS_PER_BATCH
        #: Set at train begin: the active fluent run (``nested``), and whether to run MLflow's monitor.
        self.parent_run_id: Optional[str] = None
        self.system_metrics = False
        #: The write-ahead log written for this backend (named in messages about writing it).
        self.log_path: Optional[Path] = None
        self._client = self._monitor = None
        self._tried = False
        #: Makes a new store and writes large calls (None: a store MLflow does not write in this process).
        self.helper: Optional[StoreHelper] = (StoreHelper(
            self.store.uri, self.max_metrics_per_batch if helper else math.inf) if self.store.written_here
            else None)

    @classmethod
    def for_target(cls, target: dict[str, Any], tracking_uri: Optional[str] = None,
                   helper: bool = True) -> MLflowBackend:
        """The backend a write-ahead log's target names, or ``tracking_uri`` (a masked URI's real value is
        one given earlier in this process, or ``MLFLOW_TRACKING_URI``).

        Raises:
            ValueError: Another logger's log, or a masked URI whose real value is unknown.
        """
        if target.get("logger") != cls.name:
            raise ValueError(f"replay: the log was written by {target.get('logger')!r}; only MLflowLogger "
                             "keeps a write-ahead log (W&B's own run files are uploaded with `wandb sync`).")
        require("mlflow", "replay")
        uri = tracking_uri or unmask_url(target.get("tracking_uri"), "MLFLOW_TRACKING_URI")
        return cls(validate_tracking_uri(uri), target.get("experiment_name"), helper=helper)

    def target(self, run_key: str) -> dict[str, Any]:
        """What a write-ahead log records of its target: the store as a replay from any folder reaches it
        (credentials masked), the experiment, the run key."""
        return {"logger": self.name, "tracking_uri": mask_url_credentials(self.store.uri),
                "experiment_name": self.experiment_name, "run_key": run_key}

    @property
    def where(self) -> str:
        """``"the store at <tracking URI>"`` (credentials masked), for messages."""
        return f"the store at {mask_url_credentials(self.store.uri)}"

    def location(self) -> str:
        """The write-ahead log, where this process writes the run."""
        return str(self.log_path) if self.log_path is not None else self.where

    def explain(self, error: BaseException) -> tuple[str, Optional[str]]:
        """`explain_mlflow_error` for this store's URI."""
        return explain_mlflow_error(error, self.store.uri)

    #: Only errors known to be transient.
    is_transient = staticmethod(is_transient_mlflow_error)

    def probe(self, timeout: float = 2.0) -> Optional[tuple[str, str]]:
        """An http(s) store asked once, without retries (``GET /health``): the cause and kind when it
        cannot be reached (refused, DNS, TLS), else None."""
        if not self.store.http:
            return None
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request

        try:
            http_request(get_default_host_creds(self.store.uri), "/health", "GET", max_retries=0,
                         backoff_factor=0, timeout=timeout, raise_on_status=False)
        except Exception as error:  # what kind of failure is the point
            cause, kind = self.explain(error)
            if kind in ("refused", "dns", "tls"):
                return cause, kind
        return None

    @property
    def client(self) -> Any:
        """The ``MlflowClient``, made on first use; a store without MLflow's tables is made whole first by
        the helper (MLflow's migrations never run in this process, where the user's may)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            if self.helper is not None and not store_is_made(self.store):
                self.helper.make_store()
            client = MlflowClient(tracking_uri=self.store.uri)
            # MLflow prints "View run ... at: <tracking URI>", credentials included: print it masked
            client._tracking_client._log_url = self._print_masked_run_url
            self._client = client
        return self._client

    def _print_masked_run_url(self, run_id: str) -> None:
        if not self.store.http:
            return
        base = mask_url_credentials(self.store.uri).rstrip("/")
        try:
            experiment_id = self._client.get_run(run_id).info.experiment_id
        except Exception:  # a courtesy print: never let it fail the run's end
            return
        sys.stdout.write(f"View run {run_id} at: {base}/#/experiments/{experiment_id}/runs/{run_id}\n")

    def _experiment_id(self) -> str:
        client = self.client
        if not self.experiment_name:
            return "0"
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            return experiment.experiment_id
        from mlflow.exceptions import MlflowException

        try:
            return client.create_experiment(self.experiment_name)
        except MlflowException:  # created concurrently
            experiment = client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def start(self, run_id: Optional[str], run_key: str, resume: bool) -> str:
        """Reattach to ``run_id``, else (resuming) to the run tagged ``run_key``, else create it so tagged.

        Raises:
            UnusableRunError: The run to reattach to does not exist or is deleted.
        """
        from mlflow.entities import ViewType

        client = self.client
        resume, self._tried = resume or self._tried, True  # a retry: the first try may have created it
        if resume and not run_id and run_key:  # None when the first process never created it
            if not re.fullmatch(r"[0-9A-Za-z_-]+", run_key):
                raise UnusableRunError(f"MLflowLogger: run_key must be letters, digits, '_' or '-', got "
                                       f"{run_key!r} (from the resumed checkpoint).")
            run_id = next(iter(self._runs_with_key(run_key, self._experiment_id(), ViewType.ALL)), None)
        if resume and run_id:
            self._check_usable(run_id)
            client.update_run(run_id, status="RUNNING")
            if self.tags:
                from mlflow.entities import RunTag

                tags = [RunTag(str(k), str(v)[: self.max_tag_length]) for k, v in self.tags.items()]
                client.log_batch(run_id, tags=tags, synchronous=True)
        else:
            tags = {**self.tags, RUN_KEY_TAG: run_key}
            if self.parent_run_id:
                tags["mlflow.parentRunId"] = self.parent_run_id
            experiment_id = self._experiment_id()
            run_id = client.create_run(experiment_id, run_name=self.run_name, tags=tags).info.run_id
            for twin in self._runs_with_key(run_key, experiment_id, ViewType.ACTIVE_ONLY):
                if twin != run_id:  # made by a retry inside mlflow
                    client.delete_run(twin)
        if self.system_metrics and self._monitor is None:
            self._start_monitor(run_id, resume)
        return run_id

    def _runs_with_key(self, run_key: str, experiment_id: str, view: Any) -> list[str]:
        """Ids of the runs tagged ``run_key``, the newest first."""
        runs = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'",
                                       run_view_type=view, max_results=10)
        return [run.info.run_id for run in runs]

    def _check_usable(self, run_id: str) -> None:
        from mlflow.exceptions import MlflowException

        where, source = self.where, "run_id=, MLFLOW_RUN_ID or the resumed checkpoint"
        try:
            run = self.client.get_run(run_id)
        except MlflowException as error:
            if getattr(error, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise UnusableRunError(
                f"MLflowLogger: run {run_id!r} does not exist in {where} (the run id comes from {source}). "
                f"Give the id of an existing run, or none to create a new run. ({error})") from error
        if getattr(run.info, "lifecycle_stage", "active") == "deleted":
            raise UnusableRunError(
                f"MLflowLogger: run {run_id!r} in {where} is deleted (the run id comes from {source}). "
                "Restore it (MlflowClient().restore_run) or give another run id, or none to create a new "
                "run.")

    def _start_monitor(self, run_id: str, resume: bool) -> None:
        """MLflow's own ``SystemMetricsMonitor`` (``system/...`` metrics from its own thread)."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(run_id, resume_logging=resume, tracking_uri=self.store.uri)
            monitor.start()
        except Exception as error:  # e.g. psutil missing: the run goes on without system metrics
            self._warn(("system-metrics",), "MLflowLogger: MLflow's system metrics monitor did not start "
                       "(%s: %s); no system/... metrics.", type(error).__name__, error)
            return
        self._monitor = monitor

    def logged_steps(self, run_id: str) -> dict[str, int]:
        """Last step per metric the run holds."""
        client = self.client
        histories = [client.get_metric_history(run_id, key) for key in client.get_run(run_id).data.metrics]
        return {points[0].key: max(int(point.step) for point in points) for points in histories if points}

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """One ``log_batch`` call (``MlflowClient`` splits it into requests within MLflow's limits).

        The metrics go grouped by key: each request then holds few keys, and the store updates a
        key's latest value once per request (most of a sqlite store's work at 500 keys a record).
        """
        metrics, tags = [], []
        for record in records:
            for key, value in record.metrics.items():
                metrics.append((key, value, record.time, record.step))
            for key, value in record.summary.items():
                if isinstance(value, str):
                    tags.append((key, value[: self.max_tag_length]))
                else:
                    metrics.append((key, value, record.time, record.step))
        if not (metrics or tags):
            return
        metrics.sort(key=itemgetter(0))  # stable: each key's points in step order
        points, started = len(metrics) + len(tags), time.monotonic()
        if self.helper is not None:
            try:
                if self.helper.takes(points):
                    return self.helper.log_batch(run_id, metrics, tags)
            except HelperEnded as error:  # from this process from now on (a point sent twice is kept once)
                self.helper = None
                self._warn(("helper",), "MLflowLogger: %s; the store is written from the training process "
                           "from now on (nothing is lost).", error)
        from mlflow.entities import Metric, RunTag

        metrics, tags = [Metric(*m) for m in metrics], [RunTag(*t) for t in tags]  # the tuples are freed
        self.client.log_batch(run_id, metrics=metrics, tags=tags, synchronous=True)
        if self.helper is not None:
            self.helper.spent(points, time.monotonic() - started)

    def close(self) -> None:
        """End the helper process, if one runs (a later call starts another)."""
        if self.helper is not None:
            self.helper.close()

    def log_config(self, params: dict[str, str], run_id: str) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()], synchronous=True)

    def log_file(self, folder: str, name: str, kind: str, run_id: str) -> None:
        """Upload a folder under ``name/``."""
        if not Path(folder).is_dir():
            self._warn(("artifact", folder), "MLflowLogger: %s no longer exists; not uploaded.", folder)
            return
        self.client.log_artifacts(run_id, folder, artifact_path=name)
        shutil.rmtree(folder, ignore_errors=True)

    def finish(self, status: str, run_id: str) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            try:
                monitor.finish()
            except Exception as error:  # never let the monitor keep the run open
                self._warn(("system-metrics-finish",), "MLflowLogger: stopping the system metrics monitor "
                           "failed: %s", error)
        self.client.set_terminated(run_id, status=status)


class MLflowLogger(DurableLogger):
    """Logs to MLflow through a write-ahead log; resumes the same run from a checkpoint.

    Args:
        tracking_uri: Where to log. Defaults to ``MLFLOW_TRACKING_URI``, else MLflow's default.
        experiment_name: Experiment, created when missing. Defaults to ``MLFLOW_EXPERIMENT_NAME``, else
            MLflow's default experiment.
        run_id: Reattach to this run. Defaults to ``MLFLOW_RUN_ID``; else the resumed checkpoint's.
        run_name: Name of a new run. Defaults to ``MLFLOW_RUN_NAME``, else ``TrainingArguments.run_name``.
        tags: Extra run tags, merged over ``MLFLOW_TAGS``. Defaults to None.
        nested: Make the run a child of the active fluent ``mlflow`` run. Defaults to ``MLFLOW_NESTED_RUN``.
        log_params: Log the training arguments and model config as params. Defaults to True.
        max_log_params: Log at most this many params. Defaults to ``MLFLOW_MAX_LOG_PARAMS``, else all.
        log_artifacts: ``"checkpoint"`` (every saved checkpoint, as ``checkpoint-<step>/``), ``"end"`` (the
            final model, as ``model/``), ``"all"`` or ``"false"``. Defaults to ``"all"`` when
            ``HF_MLFLOW_LOG_ARTIFACTS`` is true, else ``"false"``.
        system_metrics: Run MLflow's system metrics monitor (``system/...``). Defaults to
            ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``.
        wal_dir: Folder of the write-ahead logs. Defaults to ``<output_dir>/.mlflow_wal``.
        backoff: ``(initial, max)`` retry delays in seconds while the store is down. Defaults to (0.5, 30.0).
        **kwargs: Options of `TrackerLogger` (``log_config`` is ``log_params`` here).

    Raises:
        ModuleNotFoundError: mlflow is not installed (``pip install 'hf-callbacks-plus[mlflow]'``).
        ValueError: A tracking URI that cannot work, malformed ``MLFLOW_TAGS``, a bad argument.
    """

    stock_callback = "MLflowCallback"
    summary_as_curves = True
    #: An exception waits at most this long for the store (none while it is unreachable).
    exception_timeout = 5.0

    def __init__(self, tracking_uri: Optional[str] = None, experiment_name: Optional[str] = None,
                 run_id: Optional[str] = None, run_name: Optional[str] = None,
                 tags: Optional[dict[str, Any]] = None, nested: Optional[bool] = None,
                 log_params: bool = True, max_log_params: Optional[int] = None,
                 log_artifacts: Optional[str] = None, system_metrics: Optional[bool] = None,
                 wal_dir: Optional[str] = None, backoff: tuple[float, float] = (0.5, 30.0),
                 **kwargs: Any) -> None:
        self._mlflow = require("mlflow", "MLflowLogger")
        super().__init__(log_config=log_params, **kwargs)
        uri = unmask_url(tracking_uri, "MLFLOW_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = validate_tracking_uri(uri)
        #: The tracking URI with its credentials masked (what checkpoints and messages show).
        self.safe_tracking_uri = remember_credentials(self.tracking_uri)
        self.experiment_name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or None
        self.explicit_run_id = self.run_id = run_id or os.environ.get("MLFLOW_RUN_ID") or None
        self.run_name = mask_secrets(run_name or os.environ.get("MLFLOW_RUN_NAME") or None)
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"tags must be a dict of str to str, got {type(tags).__name__}: {tags!r}")
        self.tags = {**parse_tags_env(), **{str(k): mask_secrets(str(v)) for k, v in (tags or {}).items()}}
        self.nested = bool(nested if nested is not None else env_flag("MLFLOW_NESTED_RUN"))
        env_max = os.environ.get("MLFLOW_MAX_LOG_PARAMS")
        if max_log_params is None and env_max:
            try:
                max_log_params = int(env_max)
            except ValueError as error:
                raise ValueError(f"MLFLOW_MAX_LOG_PARAMS must be an integer, got {env_max!r}") from error
        if max_log_params is not None and max_log_params < 0:
            raise ValueError(f"max_log_params must be >= 0, got {max_log_params!r}")
        self.max_log_params = max_log_params
        self.log_config = log_params and max_log_params != 0
        if log_artifacts is None:
            log_artifacts = "all" if env_flag("HF_MLFLOW_LOG_ARTIFACTS") else "false"
        if log_artifacts not in LOG_ARTIFACTS_CHOICES:
            raise ValueError(f"log_artifacts must be one of {LOG_ARTIFACTS_CHOICES}, got {log_artifacts!r}")
        self.log_artifacts = log_artifacts
        if system_metrics is not None and not isinstance(system_metrics, bool):
            raise TypeError(f"system_metrics must be a bool or None, got {system_metrics!r}")
        self.system_metrics = bool(system_metrics if system_metrics is not None
                                   else env_flag("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"))
        if len(backoff) != 2 or not 0 < backoff[0] <= backoff[1]:
            raise ValueError(f"backoff must be (initial, max) with 0 < initial <= max, got {backoff!r}")
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.wal_dir = None if wal_dir is None else str(wal_dir)
        from mlflow.utils import validation

        self.max_name_length = validation.MAX_ENTITY_KEY_LENGTH
        self.max_param_length = validation.MAX_PARAM_VAL_LENGTH
        self.backend: Backend = MLflowBackend(self.tracking_uri, self.experiment_name, self.run_name,
                                              self.tags, warn=self.warn)

    @property
    def state_key(self) -> str:
        """One state entry per experiment (a resume finds its run by its key, whatever the URI's spelling)."""
        return f"MLflowLogger:{self.experiment_name or ''}"

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger (credentials in the URI masked)."""
        return {"tracking_uri": self.safe_tracking_uri, "experiment_name": self.experiment_name}

    clean_name = staticmethod(clean_mlflow_name)

    @property
    def wal_path(self) -> Optional[Path]:
        """The run's write-ahead log, `local_location` (None before the run has a key)."""
        location = self.local_location()
        return None if location is None else Path(location)

    def explicit_location(self) -> Optional[str]:
        """``<wal_dir>/<run key>.jsonl``, when ``wal_dir`` is given."""
        if self.wal_dir is None or self.run_key is None:
            return None
        return str(Path(self.wal_dir) / f"{self.run_key}.jsonl")

    def default_location(self) -> Optional[str]:
        """``<output_dir>/.mlflow_wal/<run key>.jsonl``."""
        if self.run_key is None:
            return None
        return str(Path(self._output_dir or Path.cwd()) / ".mlflow_wal" / f"{self.run_key}.jsonl")

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Take ``args.run_name`` and the active fluent run (``nested``); then open the run."""
        backend = self.backend
        backend.run_name = self.run_name or mask_secrets(getattr(args, "run_name", None))
        if self.nested:
            active = self._mlflow.active_run()
            backend.parent_run_id = active.info.run_id if active is not None else None
        backend.system_metrics = self.system_metrics
        return super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """With ``log_artifacts`` "checkpoint"/"all", stage the checkpoint for upload."""
        super().on_save(args, state, control, **kwargs)
        if self.log_artifacts in ("checkpoint", "all"):
            name = f"checkpoint-{state.global_step}"
            self.log_file(Path(args.output_dir) / name, name, "model")

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """With ``log_artifacts`` "end"/"all", save the final model for upload; then close."""
        if self.log_artifacts in ("end", "all") and self._is_open and model is not None:
            self._write_file(save_model_to_temp(model, "mlflow_model_"), "model", "model")
        return super().on_train_end(args, state, control, model=model, **kwargs)

    # -- the write-ahead log (DurableLogger) ---------------------------------------------------------
    def wal_target(self) -> dict[str, Any]:
        """The store, the experiment and the run key (credentials masked)."""
        return self.backend.target(self.run_key)

    def sender_options(self) -> dict[str, Any]:
        """Other runs' logs for the same store are sent once this run is open."""
        return {"for_target": lambda target: MLflowBackend.for_target(target, self.tracking_uri)}

    def _open_run(self, resume: bool, boundary: bool) -> None:
        super()._open_run(resume, boundary)
        self.backend.log_path = self._wal.path

    def _write_config(self, params: dict[str, str]) -> None:
        kept = {}
        for key, value in params.items():
            name = clean_mlflow_name(key)
            if len(name) > self.max_name_length:  # cut, two keys could collide: dropped alone
                self.warn(("long-param", key), "MLflowLogger: config key %r is longer than MLflow's %d "
                          "characters; it is not logged (the other params are).", key[:80] + "...",
                          self.max_name_length)
            else:
                kept[name] = value
        kept = dict(list(kept.items())[: self.max_log_params])
        if kept:
            super()._write_config(kept)
