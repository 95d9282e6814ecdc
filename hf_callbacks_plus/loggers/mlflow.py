"""``MLflowLogger``: MLflow tracking through ``MlflowClient``, never blocking training.

Uses ``MlflowClient`` (never the fluent global run, so it does not interfere with the user's
own ``mlflow.start_run``), ``log_batch`` for metrics, params and text values (as tags), and
``set_terminated`` for the run status.

Limits: the value and batch limits are MLflow's own (``mlflow.utils.validation``: read when the
backend is made, with a fallback only for a name an mlflow release lacks). Batches are cut
once, by the worker, to ``MAX_METRICS_PER_BATCH`` points (one call per batch, so the close
deadline is checked between calls); ``MlflowClient.log_batch`` itself splits what one record
holds beyond MLflow's per-request limits (a record of 1500 metrics), so the backend does not.

Run identity: the logger makes a run key (``uuid4().hex``) when it opens the run and saves it in
every checkpoint; the run is created with the tag ``hf_callbacks_plus.run_key``. A resumed
training whose checkpoint was saved before the store assigned the run id (a slow store) finds
the run by that tag (``search_runs``), or creates it with the same key when the first process
never did: one run, however slow the store.

Errors: only errors known to be transient are retried (`is_transient_mlflow_error`: connection
and timeout errors, MLflow's TEMPORARILY_UNAVAILABLE / REQUEST_LIMIT_EXCEEDED / INTERNAL_ERROR /
DEADLINE_EXCEEDED, an HTTP 5xx/429 or exhausted retries, a locked sqlite database); anything
else is the store refusing a record (dropped alone, with a warning) or a bug, never an outage.
A run id that does not exist, or a deleted run, is an error at the run's first start, not retried.

HTTP retries and timeouts: MLflow's own, as the environment sets them
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7 with exponential backoff;
``MLFLOW_HTTP_REQUEST_TIMEOUT``, default 120 s). The logger never sets them: mlflow reads them
from ``os.environ`` at every request (``mlflow.utils.rest_utils.http_request``), ``RestStore``
passes no per-client value and there is no thread-local setting, so bounding them for our
client alone would mean copying mlflow's private ``RestStore._call_endpoint`` or patching its
module, and setting the variables would change the user's own mlflow calls. While mlflow
retries, the worker waits in that call (training does not: records wait in the bounded queue);
the close deadline (``flush_timeout``) bounds the end, and what is unsent then is spilled and
replayed. Set ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` yourself to hand outages to the logger's
retry and spill at once (it applies to every mlflow client of the process).

Environment variables of transformers' ``MLflowCallback`` keep working; explicit arguments win:

==========================  ==============================================================
``MLFLOW_TRACKING_URI``     tracking URI (``sqlite:///...``, ``http://host:5000``, a path)
``MLFLOW_EXPERIMENT_NAME``  experiment (created when missing)
``MLFLOW_RUN_ID``           reattach to this run
``MLFLOW_RUN_NAME``         run name (else ``TrainingArguments.run_name``)
``MLFLOW_TAGS``             JSON object of extra run tags
``MLFLOW_NESTED_RUN``       make the run a child of the active fluent run
``MLFLOW_MAX_LOG_PARAMS``   log at most this many config params
``HF_MLFLOW_LOG_ARTIFACTS``  true: upload every checkpoint and the final model (``log_artifacts="all"``)
``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``  true: MLflow's own system metrics monitor (``system/...``)
==========================  ==============================================================
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import warnings
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from .._compat import env_flag, require
from .artifacts import stage_folder
from .backend import Backend
from .base import TrackerLogger, save_model_to_temp
from .records import ArtifactRecord, LogRecord, WarnOnce
from .secrets import mask_secrets, mask_url_credentials, remember_credentials, unmask_url

__all__ = ["KNOWN_TRACKING_SCHEMES", "LOG_ARTIFACTS_CHOICES", "RUN_KEY_TAG", "MLflowBackend", "MLflowLogger",
           "UnusableRunError", "is_transient_mlflow_error", "mlflow_limits", "validate_tracking_uri"]

#: Values of ``MLflowLogger(log_artifacts=...)``.
LOG_ARTIFACTS_CHOICES = ("false", "checkpoint", "end", "all")

#: Tracking URI schemes MLflow understands out of the box (plugins add more).
KNOWN_TRACKING_SCHEMES = (
    "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc",
)
#: MLflow error codes of a store that may answer later (the request itself was fine).
_TRANSIENT_ERROR_CODES = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "INTERNAL_ERROR",
                                    "DEADLINE_EXCEEDED"})
#: What an MLflow error message shows of an HTTP 5xx/429 answer or of retries given up.
_TRANSIENT_MESSAGE = re.compile(
    r"max retries exceeded|too many \d{3} error responses|error code (5\d\d|429)\b|"
    r"\b(5\d\d|429) (server error|too many requests)|database is locked", re.IGNORECASE)
_BAD_NAME_CHARS = re.compile(r"[^/\w.\- :]")
#: Tag of a run created for spilled records whose own run never opened.
RECOVERED_TAG = "hf_callbacks_plus.recovered"
#: Tag holding the client-made run key (`TrackerLogger.run_key`): a resume finds the run by it.
RUN_KEY_TAG = "hf_callbacks_plus.run_key"

#: ``mlflow.utils.validation`` names of the limits the backend follows, and the value used when
#: an installed mlflow lacks one (the values of mlflow 2.10 to 3.x).
_LIMIT_FALLBACKS = {"MAX_PARAM_VAL_LENGTH": 6000, "MAX_PARAMS_TAGS_PER_BATCH": 100,
                    "MAX_ENTITY_KEY_LENGTH": 250, "MAX_TAG_VAL_LENGTH": 8000, "MAX_METRICS_PER_BATCH": 1000}


def mlflow_limits() -> dict[str, int]:
    """MLflow's value and batch limits, from ``mlflow.utils.validation`` (a fallback per missing name).

    Returns:
        ``{name: limit}`` for each name of ``_LIMIT_FALLBACKS``.
    """
    try:
        from mlflow.utils import validation
    except ImportError:
        validation = None
    limits = {}
    for name, fallback in _LIMIT_FALLBACKS.items():
        value = getattr(validation, name, None)
        limits[name] = value if isinstance(value, int) and value > 0 else fallback
    return limits


class UnusableRunError(ValueError):
    """The run to reattach to does not exist or is deleted: a misconfiguration, never retried."""


def _network_error_types() -> tuple[type, ...]:
    """requests' and urllib3's connection and timeout errors (installed with mlflow)."""
    found: list[type] = []
    try:
        import requests

        found += [requests.exceptions.ConnectionError, requests.exceptions.Timeout]
    except ImportError:
        pass
    try:
        import urllib3

        errors = urllib3.exceptions
        found += [errors.MaxRetryError, errors.NewConnectionError, errors.ProtocolError, errors.TimeoutError]
    except ImportError:
        pass
    return tuple(found)


def is_transient_mlflow_error(error: BaseException) -> bool:
    """Tell whether an error of an MLflow call may clear by itself (worth retrying).

    Transient: connection and timeout errors (Python's, requests', urllib3's), an
    ``MlflowException`` whose error code is TEMPORARILY_UNAVAILABLE, REQUEST_LIMIT_EXCEEDED,
    INTERNAL_ERROR (also what mlflow raises when a request failed or its retries ran out) or
    DEADLINE_EXCEEDED, or whose message shows an HTTP 5xx/429 answer or exhausted retries, and a
    locked sqlite database; also an error caused by one of these. Anything else is permanent: the
    store refused the request (a bad value, a missing or deleted run) or it is a bug (a
    ``TypeError``), and retrying would repeat it forever.

    Args:
        error: What an MLflow call raised.

    Returns:
        True when the call is worth retrying.
    """
    seen = 0
    while error is not None and seen < 5:  # the error and what caused it (``raise ... from``)
        if isinstance(error, (ConnectionError, TimeoutError)) or isinstance(error, _network_error_types()):
            return True
        code = getattr(error, "error_code", None)
        if isinstance(code, str) and (code in _TRANSIENT_ERROR_CODES
                                      or _TRANSIENT_MESSAGE.search(str(error))):
            return True
        if (isinstance(error, sqlite3.OperationalError) or type(error).__name__ == "OperationalError") and (
                "database is locked" in str(error)):
            return True
        error, seen = error.__cause__, seen + 1
    return False


def _plugin_schemes() -> set[str]:
    try:
        from importlib.metadata import entry_points

        found = entry_points()
        group = found.select(group="mlflow.tracking_store") if hasattr(found, "select") else found.get(
            "mlflow.tracking_store", [])
        return {entry.name for entry in group}
    except Exception:  # metadata problems must not break validation
        return set()


def validate_tracking_uri(uri: Optional[str]) -> Optional[str]:
    """Check a tracking URI's scheme; return the URI unchanged.

    Args:
        uri: A tracking URI, a local path, or None (MLflow's default).

    Raises:
        ValueError: The scheme is neither one MLflow knows nor one a plugin registers, or a
            sqlite database cannot be created where the URI says.
    """
    if uri is None or uri == "":
        return None
    if not isinstance(uri, str):
        raise TypeError(f"tracking_uri must be a str, got {type(uri).__name__}: {uri!r}")
    scheme = urlparse(uri).scheme.lower()
    if len(scheme) <= 1 or scheme == "file":  # a plain path, a Windows drive letter, file:
        _refuse_file_store_if_disabled(uri)
        return uri
    base = scheme.split("+")[0]
    if base == "sqlite":
        _refuse_unusable_sqlite_path(uri)
    if base in KNOWN_TRACKING_SCHEMES or scheme in _plugin_schemes():
        return uri
    raise ValueError(
        f"tracking_uri (or MLFLOW_TRACKING_URI) {uri!r} has an unknown scheme {scheme!r}. Valid schemes: "
        f"{', '.join(KNOWN_TRACKING_SCHEMES)}, a local path, or a scheme registered by an MLflow plugin."
    )


def _refuse_unusable_sqlite_path(uri: str) -> None:
    """A sqlite database MLflow cannot create (its folder is under a file, or not writable): say so
    now, not as a run that could not start after the training (MLflow creates missing folders)."""
    for module in ("sqlalchemy", "alembic"):  # not in mlflow-skinny: said now, not after training
        require(module, f"MLflowLogger(tracking_uri={uri!r}) (a local sqlite store)")
    path = uri.split(":///", 1)[1].split("?", 1)[0] if ":///" in uri else ""
    if not path or path == ":memory:":
        return
    path = os.path.abspath(path)
    problem = "is a directory" if os.path.isdir(path) else None
    ancestor = os.path.dirname(path)
    while problem is None and not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if problem is None and not os.path.isdir(ancestor):
        problem = f"cannot be created: {ancestor!r} is a file, not a folder"
    elif problem is None and not os.access(ancestor, os.W_OK | os.X_OK):
        problem = f"cannot be created: the folder {ancestor!r} is not writable"
    if problem is not None:
        raise ValueError(
            f"tracking_uri (or MLFLOW_TRACKING_URI) {uri!r}: the sqlite database {path!r} {problem}. Use "
            "a path in a writable folder, e.g. tracking_uri='sqlite:///mlflow.db' (relative to the working "
            "directory) or 'sqlite:////absolute/path/mlflow.db'."
        )


def _refuse_file_store_if_disabled(uri: str) -> None:
    """The installed mlflow refuses file stores (``./mlruns``, ``file:``) unless
    ``MLFLOW_ALLOW_FILE_STORE`` is set: say so now, not as an outage at the first log."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # mlflow missing (said at start) or an mlflow that still accepts file stores
        return
    if not MLFLOW_ALLOW_FILE_STORE.get():
        raise ValueError(
            f"tracking_uri (or MLFLOW_TRACKING_URI) {uri!r} is a file store, which the installed mlflow "
            "refuses. Use a database store, e.g. tracking_uri='sqlite:///mlflow.db', or set "
            "MLFLOW_ALLOW_FILE_STORE=true to keep the file store."
        )


def parse_tags_env() -> dict[str, str]:
    """``MLFLOW_TAGS`` as a dict.

    Raises:
        ValueError: ``MLFLOW_TAGS`` is not a JSON object.
    """
    raw = os.environ.get("MLFLOW_TAGS")
    if not raw:
        return {}
    try:
        tags = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"MLFLOW_TAGS must be a JSON object such as '{{\"team\": \"nlp\"}}', got {raw!r} ({error})."
        ) from error
    if not isinstance(tags, dict):
        raise ValueError(f"MLFLOW_TAGS must be a JSON object (a dict), got {type(tags).__name__}: {raw!r}")
    return {str(key): mask_secrets(str(value)) for key, value in tags.items()}


class MLflowBackend(Backend):
    """MLflow through ``MlflowClient``: ``log_batch`` up to MLflow's limits, ``set_terminated``.

    Args:
        mlflow: The ``mlflow`` module.
        tracking_uri: Where to log (None: MLflow's default).
        experiment_name: Experiment, created when missing (None: the default experiment).
        run_name: Name of a new run (None: MLflow's generated name).
        tags: Tags of the run.
        max_log_params: Log at most this many params per run (None: all).
        warn: Warns once per key. Defaults to a new `WarnOnce`.

    The limits (``max_param_length``, ``max_params_per_batch``, ``max_name_length``,
    ``max_tag_length``, ``max_tags_per_batch``, ``max_metrics_per_batch``) are MLflow's own,
    read from ``mlflow.utils.validation`` (`mlflow_limits`).
    """

    name = "MLflowLogger"
    summary_as_curves = True
    can_write_other_runs = True
    #: mlflow retries an unreachable server for minutes inside one call: an exception does not
    #: wait for that (the FAILED status and the records are spilled and replayed into the run).
    exception_start_wait = 3.0
    #: One ``log_batch`` per second at most (each is a commit in a sqlite store: 20-30 ms of CPU
    #: however few points it holds), unless a full batch is ready.
    send_interval = 1.0

    def __init__(self, mlflow: Any, tracking_uri: Optional[str], experiment_name: Optional[str],
                 run_name: Optional[str], tags: dict[str, str], max_log_params: Optional[int],
                 warn: Optional[WarnOnce] = None) -> None:
        self._mlflow = mlflow
        self._warn = warn or WarnOnce()
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = tags
        self.max_log_params = max_log_params
        limits = mlflow_limits()
        self.max_param_length: int = limits["MAX_PARAM_VAL_LENGTH"]
        self.max_params_per_batch: int = limits["MAX_PARAMS_TAGS_PER_BATCH"]
        self.max_name_length: int = limits["MAX_ENTITY_KEY_LENGTH"]
        self.max_tag_length: int = limits["MAX_TAG_VAL_LENGTH"]
        self.max_tags_per_batch: int = limits["MAX_PARAMS_TAGS_PER_BATCH"]
        self.max_metrics_per_batch: int = limits["MAX_METRICS_PER_BATCH"]
        #: Set at train begin: the active fluent run (``nested``) and ``args.run_name``.
        self.parent_run_id: Optional[str] = None
        self.args_run_name: Optional[str] = None
        self._client: Any = None
        #: Start MLflow's system metrics monitor with each run (``system/...`` metrics).
        self.system_metrics = False
        self._monitor: Any = None
        self._params_sent: dict[str, int] = {}

    def clean_name(self, name: str) -> str:
        """Replace characters MLflow rejects with ``_`` and drop empty path parts."""
        return clean_mlflow_name(name)

    @property
    def client(self) -> Any:
        """The ``MlflowClient`` (made on first use)."""
        if self._client is None:  # MLflow's HTTP retries/timeout are left as the user set them
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.tracking_uri)
            service = getattr(client, "_tracking_client", None)
            if service is not None and callable(getattr(service, "_log_url", None)):
                # MLflow writes "View run ... at: <tracking URI>" to stdout at each set_terminated,
                # credentials included: this client prints the masked URL instead (no global switch)
                service._log_url = self._print_masked_run_url
            self._client = client
        return self._client

    def _print_masked_run_url(self, run_id: str) -> None:
        """What MLflow prints when a run ends on a server, with the URI's credentials masked."""
        if not self.tracking_uri or not self.tracking_uri.startswith(("http://", "https://")):
            return
        base = mask_url_credentials(self.tracking_uri).rstrip("/")
        try:
            experiment_id = self._client.get_run(run_id).info.experiment_id
        except Exception:  # the print is a courtesy: never let it fail the run's end
            return
        sys.stdout.write(f"View run {run_id} at: {base}/#/experiments/{experiment_id}/runs/{run_id}\n")

    def _experiment_id(self) -> str:
        client = self.client
        if not self.experiment_name:
            return "0"
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return client.create_experiment(self.experiment_name)
        except self._mlflow.exceptions.MlflowException:  # created concurrently
            experiment = client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def start(self, run_id: Optional[str], resume: bool, run_key: Optional[str] = None) -> str:
        """Reattach to ``run_id``, else (resuming) to the run tagged with ``run_key``, else create
        the run, tagged with ``run_key``.

        Raises:
            UnusableRunError: The run to reattach to does not exist or is deleted.
        """
        client = self.client
        if resume and not run_id and run_key:
            run_id = self._run_with_key(run_key)  # None: the first process never created it
        if resume and run_id:
            self._check_usable(run_id)
            client.update_run(run_id, status="RUNNING")
            if self.tags:
                self.set_tags(self.tags, run_id)
        else:
            tags = dict(self.tags)
            if self.parent_run_id:
                tags["mlflow.parentRunId"] = self.parent_run_id
            if run_key:
                tags[RUN_KEY_TAG] = run_key
            name = self.run_name or self.args_run_name
            run_id = client.create_run(self._experiment_id(), run_name=name, tags=tags).info.run_id
        if self.system_metrics and self._monitor is None:
            self._start_monitor(run_id, resume)
        return run_id

    def _run_with_key(self, run_key: str) -> Optional[str]:
        """The id of the run of this experiment tagged with ``run_key`` (deleted ones included), or None."""
        from mlflow.entities import ViewType

        if not re.fullmatch(r"[0-9A-Za-z_-]+", run_key):
            raise UnusableRunError(f"MLflowLogger: run_key must be letters, digits, '_' or '-', got "
                                   f"{run_key!r} (from the resumed checkpoint).")
        runs = self.client.search_runs([self._experiment_id()],
                                       filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'",
                                       run_view_type=ViewType.ALL, max_results=1)
        return runs[0].info.run_id if runs else None

    def _check_usable(self, run_id: str) -> None:
        """Raise `UnusableRunError` when ``run_id`` does not exist or is deleted (never retried)."""
        where = mask_url_credentials(self.tracking_uri) or "MLflow's default tracking URI"
        try:
            run = self.client.get_run(run_id)
        except self._mlflow.exceptions.MlflowException as error:
            if getattr(error, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise UnusableRunError(
                f"MLflowLogger: run {run_id!r} does not exist in {where} (the run id comes from run_id=, "
                "MLFLOW_RUN_ID or the resumed checkpoint). Give the id of an existing run, or none to "
                f"create a new run. ({error})") from error
        if getattr(run.info, "lifecycle_stage", "active") == "deleted":
            raise UnusableRunError(
                f"MLflowLogger: run {run_id!r} in {where} is deleted (the run id comes from run_id=, "
                "MLFLOW_RUN_ID or the resumed checkpoint). Restore it (MlflowClient().restore_run) or give "
                "another run id, or none to create a new run.")

    def _start_monitor(self, run_id: str, resume: bool) -> None:
        """MLflow's own ``SystemMetricsMonitor`` (its thread samples CPU, memory, disk, network
        and logs ``system/...`` metrics to this run)."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(run_id, resume_logging=resume, tracking_uri=self.tracking_uri)
            monitor.start()
        except Exception as error:  # e.g. psutil missing: the run goes on without system metrics
            self._warn(("system-metrics",), "MLflowLogger: MLflow's system metrics monitor did not start "
                       "(%s: %s); no system/... metrics.", type(error).__name__, error)
            return
        self._monitor = monitor

    def log_artifact(self, record: ArtifactRecord, run_id: str) -> None:
        """Upload a staged folder (a checkpoint, the final model) under ``record.aliases[0]``."""
        folder = Path(record.path)
        if not folder.is_dir():
            self._warn(("artifact", str(folder)), "MLflowLogger: %s no longer exists; not uploaded.", folder)
            return
        name = record.aliases[0] if record.aliases else None
        self.client.log_artifacts(run_id, str(folder), artifact_path=name)
        if record.cleanup:
            shutil.rmtree(folder, ignore_errors=True)

    def recovery_run(self, run_key: Optional[str] = None) -> str:
        """The run tagged with ``run_key`` (found, or created with the tag), else a new run tagged
        `RECOVERED_TAG`."""
        if run_key:
            found = self._run_with_key(run_key)
            if found is not None:
                return found
        tags = {**self.tags, RUN_KEY_TAG: run_key} if run_key else {**self.tags, RECOVERED_TAG: "true"}
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name or self.args_run_name,
                                     tags=tags)
        return run.info.run_id

    def logged_steps(self, run_id: str) -> dict[str, int]:
        client = self.client
        steps = {}
        for key in client.get_run(run_id).data.metrics:
            history = client.get_metric_history(run_id, key)
            if history:
                steps[key] = max(int(metric.step) for metric in history)
        return steps

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """One ``log_batch`` call: the worker's batches hold at most ``max_metrics_per_batch`` points,
        and ``MlflowClient.log_batch`` splits a bigger record into requests within MLflow's limits."""
        from mlflow.entities import Metric, RunTag

        metrics = []
        tags = []
        for record in records:
            for key, value in record.metrics.items():
                metrics.append(Metric(key, value, record.timestamp, record.step))
            for key, value in record.summary.items():
                if isinstance(value, str):
                    tags.append(RunTag(key, value[: self.max_tag_length]))
                else:
                    metrics.append(Metric(key, value, record.timestamp, record.step))
        if metrics or tags:
            self.client.log_batch(run_id, metrics=metrics, tags=tags, synchronous=True)

    def store_config(self, params: dict[str, str], run_id: str) -> None:
        from mlflow.entities import Param

        items = []
        for key, value in params.items():
            name = clean_mlflow_name(key)
            if len(name) > self.max_name_length:  # cut, two keys could collide: drop it alone
                self._warn(("long-param", key), "MLflowLogger: config key %r is longer than MLflow's %d "
                           "characters; it is not logged (the other params are).", key[:80] + "...",
                           self.max_name_length)
                continue
            items.append((name, value))
        if self.max_log_params is not None:
            logged = self._params_sent.get(run_id, 0)
            items = items[: max(0, self.max_log_params - logged)]
            self._params_sent[run_id] = logged + len(items)
        if items:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in items], synchronous=True)

    def set_tags(self, tags: dict[str, str], run_id: str) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(str(k), str(v)[: self.max_tag_length]) for k, v in tags.items()]
        if items:  # MlflowClient.log_batch splits them into requests of MLflow's size
            self.client.log_batch(run_id, tags=items, synchronous=True)

    def finish(self, status: str, run_id: str) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            try:
                monitor.finish()
            except Exception as error:  # never let the monitor keep the run open
                self._warn(("system-metrics-finish",), "MLflowLogger: stopping the system metrics monitor "
                           "failed: %s", error)
        self.client.set_terminated(run_id, status=status)

    def target(self) -> dict[str, Any]:
        return {"logger": self.name, "tracking_uri": mask_url_credentials(self.tracking_uri),
                "experiment_name": self.experiment_name}

    def is_transient(self, error: BaseException) -> bool:
        """Only errors known to be transient (`is_transient_mlflow_error`); the rest is permanent."""
        return is_transient_mlflow_error(error)


def clean_mlflow_name(name: str) -> str:
    """Replace characters MLflow rejects with ``_`` and drop empty path parts."""
    cleaned = _BAD_NAME_CHARS.sub("_", name)
    parts = [part if part not in (".", "..") else "_" for part in cleaned.split("/") if part]
    return "/".join(parts) or "_"


class MLflowLogger(TrackerLogger):
    """Logs to MLflow from a background thread; resumes the same run from a checkpoint.

    Args:
        tracking_uri: Where to log. Defaults to ``MLFLOW_TRACKING_URI``, else MLflow's default.
        experiment_name: Experiment, created when missing. Defaults to ``MLFLOW_EXPERIMENT_NAME``,
            else MLflow's default experiment.
        run_id: Reattach to this run. Defaults to ``MLFLOW_RUN_ID``; a run id saved in the
            resumed checkpoint is used when neither is given.
        run_name: Name of a new run. Defaults to ``MLFLOW_RUN_NAME``, else
            ``TrainingArguments.run_name``.
        tags: Extra run tags, merged over ``MLFLOW_TAGS``. Defaults to None.
        nested: Make the run a child of the active fluent ``mlflow`` run. Defaults to
            ``MLFLOW_NESTED_RUN``, else False.
        log_params: Log the training arguments and model config as params. Defaults to True.
        max_log_params: Log at most this many params. Defaults to ``MLFLOW_MAX_LOG_PARAMS``, else all.
        http_timeout: No longer used (it set ``MLFLOW_HTTP_REQUEST_TIMEOUT`` for the whole process);
            passing it warns. MLflow's own timeout applies: set ``MLFLOW_HTTP_REQUEST_TIMEOUT``
            yourself to change it. Defaults to None.
        http_max_retries: No longer used (it set ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` for the whole
            process); passing it warns. Set ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` yourself (0 hands
            outages to the logger's retry and spill at once). Defaults to None.
        log_artifacts: Upload model files as run artifacts, from the background thread:
            ``"checkpoint"`` (every saved checkpoint, as ``checkpoint-<step>/``; staged as hard
            links first, so checkpoint rotation cannot remove it before the upload), ``"end"``
            (the final model, ``save_pretrained``, as ``model/``), ``"all"`` (both) or
            ``"false"``. Defaults to ``"all"`` when ``HF_MLFLOW_LOG_ARTIFACTS`` is true (like
            the stock callback), else ``"false"``.
        system_metrics: Run MLflow's own system metrics monitor (``system/cpu_utilization_percentage``,
            memory, disk, network; ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` sets the period).
            Defaults to ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``, else False.
        **kwargs: Options of `TrackerLogger`.

    Raises:
        ModuleNotFoundError: mlflow is not installed (``pip install 'hf-callbacks-plus[mlflow]'``).
        ValueError: Unknown tracking URI scheme or malformed ``MLFLOW_TAGS``.

    Example:
        >>> logger = MLflowLogger(tracking_uri="sqlite:///mlflow.db", experiment_name="demo")
        >>> trainer = Trainer(..., callbacks=[logger])  # doctest: +SKIP
    """

    stock_callback = "MLflowCallback"

    def __init__(
        self,
        tracking_uri: Optional[str] = None,
        experiment_name: Optional[str] = None,
        run_id: Optional[str] = None,
        run_name: Optional[str] = None,
        tags: Optional[dict[str, Any]] = None,
        nested: Optional[bool] = None,
        log_params: bool = True,
        max_log_params: Optional[int] = None,
        http_timeout: Optional[int] = None,
        http_max_retries: Optional[int] = None,
        log_artifacts: Optional[str] = None,
        system_metrics: Optional[bool] = None,
        **kwargs: Any,
    ) -> None:
        self._mlflow = require("mlflow", "MLflowLogger")
        super().__init__(log_config=log_params, **kwargs)
        uri = unmask_url(tracking_uri, "MLFLOW_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = validate_tracking_uri(uri)
        #: The tracking URI with its credentials masked: what checkpoints, file names and logs show.
        self.safe_tracking_uri = remember_credentials(self.tracking_uri)
        self.experiment_name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or None
        self.explicit_run_id = run_id or os.environ.get("MLFLOW_RUN_ID") or None
        self.run_id = self.explicit_run_id
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
        for name, value, variable in (("http_timeout", http_timeout, "TIMEOUT"),
                                      ("http_max_retries", http_max_retries, "MAX_RETRIES")):
            if value is not None:
                warnings.warn(f"MLflowLogger({name}={value!r}) has no effect: the logger no longer "
                              "changes MLflow's HTTP settings for the whole process. Set "
                              f"MLFLOW_HTTP_REQUEST_{variable} in the environment instead (it applies "
                              "to every mlflow client of the process).", FutureWarning, stacklevel=2)
        self.backend: MLflowBackend = MLflowBackend(
            self._mlflow, self.tracking_uri, self.experiment_name, self.run_name, self.tags, max_log_params,
            warn=self._warn)
        if log_artifacts is None:
            log_artifacts = "all" if env_flag("HF_MLFLOW_LOG_ARTIFACTS") else "false"
        if log_artifacts not in LOG_ARTIFACTS_CHOICES:
            raise ValueError(f"log_artifacts must be one of {LOG_ARTIFACTS_CHOICES}, got {log_artifacts!r}")
        self.log_artifacts = log_artifacts
        if system_metrics is not None and not isinstance(system_metrics, bool):
            raise TypeError(f"system_metrics must be a bool or None, got {system_metrics!r}")
        self.system_metrics = bool(system_metrics if system_metrics is not None
                                   else env_flag("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"))
        self.backend.system_metrics = self.system_metrics

    @property
    def state_key(self) -> str:
        """One state entry per (tracking URI, experiment); credentials in the URI are masked."""
        return f"MLflowLogger:{self.safe_tracking_uri or ''}:{self.experiment_name or ''}"

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger (credentials in the URI masked: a logger
        rebuilt from them in this process gets the real URI back, see ``unmask_url``)."""
        return {"tracking_uri": self.safe_tracking_uri, "experiment_name": self.experiment_name}

    @staticmethod
    def clean_name(name: str) -> str:
        """Replace characters MLflow rejects with ``_`` and drop empty path parts."""
        return clean_mlflow_name(name)

    # -- events ------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Remember ``args.run_name``, and the active fluent run when ``nested``; then start."""
        self.backend.args_run_name = mask_secrets(getattr(args, "run_name", None))
        if self.nested:
            active = self._mlflow.active_run()
            self.backend.parent_run_id = active.info.run_id if active is not None else None
        return super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """With ``log_artifacts`` "checkpoint"/"all", stage the checkpoint and queue its upload."""
        super().on_save(args, state, control, **kwargs)
        if self.log_artifacts not in ("checkpoint", "all") or self._worker is None:
            return
        name = f"checkpoint-{state.global_step}"
        staged = stage_folder(Path(args.output_dir) / name, Path(args.output_dir) / ".tracker_artifacts")
        if staged is not None:
            self._worker.submit(ArtifactRecord(str(staged), [name], cleanup=True))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """With ``log_artifacts`` "end"/"all", save the final model and queue its upload; then close."""
        if self.log_artifacts in ("end", "all") and self._worker is not None and model is not None:
            folder = save_model_to_temp(model, "mlflow_model_")
            self._worker.submit(ArtifactRecord(folder, ["model"], cleanup=True))
        return super().on_train_end(args, state, control, model=model, **kwargs)

    def _queue_config(self, args: Any, model: Any) -> None:
        if self.max_log_params == 0:
            return
        super()._queue_config(args, model)
