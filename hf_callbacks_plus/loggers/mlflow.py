"""``MLflowLogger``: MLflow tracking through ``MlflowClient``, never blocking training.

Uses ``MlflowClient`` (never the fluent global run, so it does not interfere with the user's
own ``mlflow.start_run``), ``log_batch`` for metrics (up to 1000 per call), params (up to 100
per call) and text values (as tags), and ``set_terminated`` for the run status.

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
import sys
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from .._compat import env_flag, require
from .artifacts import stage_folder
from .backend import Backend
from .base import TrackerLogger, save_model_to_temp
from .records import ArtifactRecord, LogRecord, WarnOnce
from .secrets import mask_secrets, mask_url_credentials, remember_credentials, unmask_url

__all__ = ["KNOWN_TRACKING_SCHEMES", "LOG_ARTIFACTS_CHOICES", "MLflowBackend", "MLflowLogger",
           "validate_tracking_uri"]

#: Values of ``MLflowLogger(log_artifacts=...)``.
LOG_ARTIFACTS_CHOICES = ("false", "checkpoint", "end", "all")

#: Tracking URI schemes MLflow understands out of the box (plugins add more).
KNOWN_TRACKING_SCHEMES = (
    "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc",
)
_PERMANENT_ERROR_CODES = {
    "INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST",
    "PERMISSION_DENIED", "INVALID_STATE", "UNAUTHENTICATED", "ENDPOINT_NOT_FOUND",
}
_BAD_NAME_CHARS = re.compile(r"[^/\w.\- :]")
#: Tag of a run created for spilled records whose own run never opened.
RECOVERED_TAG = "hf_callbacks_plus.recovered"


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
        ValueError: The scheme is neither one MLflow knows nor one a plugin registers.
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
    if base in KNOWN_TRACKING_SCHEMES or scheme in _plugin_schemes():
        return uri
    raise ValueError(
        f"tracking_uri (or MLFLOW_TRACKING_URI) {uri!r} has an unknown scheme {scheme!r}. Valid schemes: "
        f"{', '.join(KNOWN_TRACKING_SCHEMES)}, a local path, or a scheme registered by an MLflow plugin."
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
        http_timeout: Seconds per HTTP request, set as ``MLFLOW_HTTP_REQUEST_TIMEOUT`` when unset.
        http_max_retries: MLflow's own HTTP retries, set as ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``
            when unset.
        warn: Warns once per key. Defaults to a new `WarnOnce`.
    """

    name = "MLflowLogger"
    max_param_length = 6000
    max_params_per_batch = 100
    max_name_length = 250
    max_tag_length = 8000
    max_tags_per_batch = 100
    max_metrics_per_batch = 1000
    summary_as_curves = True
    can_write_other_runs = True

    def __init__(self, mlflow: Any, tracking_uri: Optional[str], experiment_name: Optional[str],
                 run_name: Optional[str], tags: dict[str, str], max_log_params: Optional[int],
                 http_timeout: int, http_max_retries: int, warn: Optional[WarnOnce] = None) -> None:
        self._mlflow = mlflow
        self._warn = warn or WarnOnce()
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = tags
        self.max_log_params = max_log_params
        self.http_timeout = http_timeout
        self.http_max_retries = http_max_retries
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
        if self._client is None:
            if self.tracking_uri and self.tracking_uri.startswith(("http://", "https://")):
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(self.http_max_retries))
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(self.http_timeout))
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

    def start(self, run_id: Optional[str], resume: bool) -> str:
        client = self.client
        if resume and run_id:
            client.get_run(run_id)  # raises RESOURCE_DOES_NOT_EXIST for an unknown id
            client.update_run(run_id, status="RUNNING")
            if self.tags:
                self.set_tags(self.tags, run_id)
        else:
            tags = dict(self.tags)
            if self.parent_run_id:
                tags["mlflow.parentRunId"] = self.parent_run_id
            name = self.run_name or self.args_run_name
            run_id = client.create_run(self._experiment_id(), run_name=name, tags=tags).info.run_id
        if self.system_metrics and self._monitor is None:
            self._start_monitor(run_id, resume)
        return run_id

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

    def recovery_run(self) -> str:
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name or self.args_run_name,
                                     tags={**self.tags, RECOVERED_TAG: "true"})
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
        for start in range(0, len(tags), self.max_tags_per_batch):
            self.client.log_batch(run_id, tags=tags[start:start + self.max_tags_per_batch], synchronous=True)
        for start in range(0, len(metrics), self.max_metrics_per_batch):
            chunk = metrics[start:start + self.max_metrics_per_batch]
            self.client.log_batch(run_id, metrics=chunk, synchronous=True)

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
        for start in range(0, len(items), self.max_tags_per_batch):
            self.client.log_batch(run_id, tags=items[start:start + self.max_tags_per_batch], synchronous=True)

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
        code = getattr(error, "error_code", None)
        return code not in _PERMANENT_ERROR_CODES


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
        http_timeout: Seconds per HTTP request (``MLFLOW_HTTP_REQUEST_TIMEOUT``, set only when you
            did not set it). Defaults to 10.
        http_max_retries: MLflow's own HTTP retries (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, set only
            when you did not set it). Our worker retries with backoff already. Defaults to 0.
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
        http_timeout: int = 10,
        http_max_retries: int = 0,
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
        self.http_timeout = http_timeout
        self.http_max_retries = http_max_retries
        self.backend: MLflowBackend = MLflowBackend(
            self._mlflow, self.tracking_uri, self.experiment_name, self.run_name, self.tags, max_log_params,
            http_timeout, http_max_retries, self._warn)
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
