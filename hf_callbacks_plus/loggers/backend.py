"""The backend interface of the tracker loggers: start / store config / log / finish.

A `Backend` talks to one tracking service (MLflow, W&B, a JSONL file, TensorBoard event files)
and nothing else: no queue, no retry, no spill, no dedupe. It is called in this order: `start`
once, then `log` / `store_config` / `set_tags` / `log_artifact` in record order, then `finish`,
by the `BackgroundWorker` from its thread (MLflow, a remote store without a durable buffer of
its own), or by the `InlineWriter` on the training thread (`buffers_itself`: JSONL, TensorBoard
and W&B, whose libraries buffer and write in the background themselves). Modelled on
accelerate's ``GeneralTracker``.

Every call names the run (``run_id``): the worker replays spilled records of an earlier run
into that run.

Capability attributes tell the worker the backend's limits, so it batches up to them.
"""

from __future__ import annotations

from typing import Any, Optional

from .records import ArtifactRecord, LogRecord

__all__ = ["FAILED", "FINISHED", "Backend"]

FINISHED = "FINISHED"
FAILED = "FAILED"


class Backend:
    """One tracking service. Subclasses implement `start`, `log`, `store_config`, `finish`."""

    #: Shown in warnings.
    name: str = "backend"
    #: The tracker's library buffers and writes in the background itself (JSONL's file buffer,
    #: the ``SummaryWriter``'s queue thread, W&B's service process and its offline log): records go
    #: to it on the training thread (`InlineWriter`), with nothing of ours to retry or spill; a
    #: store without such a buffer (False: MLflow) goes through the `BackgroundWorker`.
    buffers_itself: bool = False
    #: Opening the run takes seconds (``wandb.init``): the `InlineWriter` opens it on a thread of
    #: its own and keeps the records logged meanwhile in memory until it is open.
    opens_slowly: bool = False
    #: Longest param value the backend accepts (None: no limit).
    max_param_length: Optional[int] = None
    #: Most params per `store_config` call (None: no limit).
    max_params_per_batch: Optional[int] = None
    #: Longest metric name the backend accepts (None: no limit).
    max_name_length: Optional[int] = None
    #: Most metric points per call (MLflow ``log_batch``: 1000); the worker's batches stay within
    #: it, so each batch is one call and the close deadline is checked between calls (None: no limit).
    max_metrics_per_batch: Optional[int] = None
    #: Send numeric summary values as curve points at the current step (backends without a
    #: run summary, such as MLflow); they are then deduplicated per step like curves.
    summary_as_curves: bool = False
    #: How the stock transformers callback names keys (``key_names="stock"``): ``"raw"`` (the
    #: ``logs`` keys as they are: MLflowCallback) or ``"rewrite_logs"`` (``eval_`` -> ``eval/``,
    #: ``test_`` -> ``test/``, anything else -> ``train/``: WandbCallback, TensorBoardCallback).
    stock_key_style: str = "raw"
    #: Keys the stock callback puts in the run summary, raw, instead of a curve.
    stock_summary_keys: frozenset = frozenset()

    #: The global step a resumed ``train()`` starts from (the checkpoint's), set by the logger at
    #: train begin; None for a fresh ``train()``. TensorBoard purges events after it, W&B checks
    #: earlier offline folders against it.
    resume_step: Optional[int] = None
    #: Send at most one call per this many seconds, unless a full batch is ready: records logged
    #: meanwhile go in the same call (a store that pays per call, as MLflow's sqlite store does
    #: with one commit per ``log_batch``). Flushing, closing and retrying never wait for it.
    send_interval: float = 0.0
    #: Seconds an exception in training waits for the run to open so it can take its FAILED
    #: status (W&B opens a run in seconds); a backend whose unsent records and status replay into
    #: their run needs little (MLflow: 3).
    exception_start_wait: float = 20.0

    def prepare_process(self) -> None:
        """Training thread, before the logger registers its exit hook. Defaults to nothing.

        A backend whose library tears itself down at interpreter exit (W&B) sets that up here,
        so the logger's exit hook (registered after) runs first.
        """

    def location(self) -> str:
        """Where the run is written, for messages (a file or folder, a store's URI). Defaults to the name."""
        return self.name

    def sync(self) -> None:
        """Write what the library buffers to disk (a checkpoint is saved). Defaults to nothing."""

    def clean_name(self, name: str) -> str:
        """Turn a rendered metric name into one the backend accepts. Defaults to unchanged."""
        return name

    def new_run_id(self) -> Optional[str]:
        """The id of a new run, made by the client before the run starts, so the first checkpoint
        names it without asking the backend (W&B, TensorBoard, JSONL). Defaults to None: the
        store assigns ids (MLflow), and the run is found again by its run key."""
        return None

    def start(self, run_id: Optional[str], resume: bool, run_key: Optional[str] = None) -> str:
        """Open the run, or reattach to it when ``resume``; return its id.

        Args:
            run_id: The run's id when known (given, restored from a checkpoint, or made by
                `new_run_id`); None when the store assigns it.
            resume: The run may exist already (its id or key came from a checkpoint, the user or
                an earlier open): reattach to it.
            run_key: The client-made key of the run, saved in every checkpoint. A backend whose
                store assigns ids sets it as a run tag when it creates the run and, when
                ``resume`` without ``run_id``, looks the run up by it (creating it, with this key,
                when the first process never did). Defaults to None.
        """
        raise NotImplementedError

    def logged_steps(self, run_id: str) -> dict[str, int]:
        """Last step per metric the run already holds (asked on resume). Defaults to {}."""
        return {}

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """Send log records (``step``, ``timestamp``, ``metrics``, ``summary``), in order."""
        raise NotImplementedError

    def store_config(self, params: dict[str, str], run_id: str) -> None:
        """Log config params (at most `max_params_per_batch` per call)."""
        raise NotImplementedError

    def set_tags(self, tags: dict[str, str], run_id: str) -> None:
        """Set run tags. Defaults to doing nothing."""

    def log_artifact(self, record: ArtifactRecord, run_id: str) -> None:
        """Upload a folder as a model artifact. Defaults to doing nothing."""

    def finish(self, status: str, run_id: str) -> None:
        """Close the run with ``"FINISHED"`` or ``"FAILED"``."""
        raise NotImplementedError

    def recovery_run(self, run_key: Optional[str] = None) -> str:
        """The run for spilled records whose run id was never known; return its id.

        The run tagged with ``run_key`` (found, or created with that tag: the first process never
        heard back from the store), else a new run.
        """
        raise NotImplementedError

    def is_transient(self, error: BaseException) -> bool:
        """Tell whether an error is worth retrying. Defaults to True."""
        return True

    def target(self) -> dict[str, Any]:
        """What the records are for, saved beside a spill file so ``hf-callbacks-plus replay`` can
        rebuild the backend: ``{"logger": ..., ...}``, credentials masked. Defaults to the name."""
        return {"logger": self.name}
