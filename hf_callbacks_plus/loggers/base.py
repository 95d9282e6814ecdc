"""``TrackerLogger``: the callback every experiment-tracker logger is (W&B, MLflow, JSONL, TensorBoard).

A logger is a callback in front of three objects:

* a `Backend` (start / store config / log / finish) that talks to one tracking service;
* a `StepLedger`: the run id, the client-made run key and the last logged step of every
  metric, part of the checkpointed state, so a resumed training continues the same run and does not log again
  the steps the earlier process sent (the *resume boundary*, fixed when the training starts);
  every point produced in the current session is delivered, including a second value at one
  step (``trainer.evaluate()`` after training);
* for a remote store without a durable buffer of its own (MLflow), a `BackgroundWorker`, given
  the backend and the ledger: ``on_log`` copies the logs and queues them (microseconds), the
  worker renders them with the shared key grammar, sends them in batches, retries, spills, and
  backend errors never reach the training loop; for a tracker whose library buffers in the
  background itself (JSONL, TensorBoard, W&B: `Backend.buffers_itself`), an `InlineWriter`,
  which does the rendering and planning on the training thread and hands the record to the
  library (nothing to retry or spill; W&B's run is opened on a thread of its own).

The callback itself logs the ``TrainingArguments`` and the model config once (flattened, cut
to the backend's limits, secrets redacted), logs only on the main process
(``state.is_world_process_zero`` and ``RANK``, checked at call time), and closes the run
FINISHED at ``on_train_end``, FAILED at ``on_exception`` (TrainerPlus, LightweightTrainer)
and, for a stock ``transformers.Trainer`` which has no exception event, FAILED at interpreter
exit when ``on_train_end`` never came (one ``atexit`` hook per logger).

A logger subclass builds its backend in ``__init__`` (``self.backend = ...``).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Optional, Union

from ..core.claims import TrainBeginClaims
from ..core.stateful import SelfRestoringState
from ..metrics.keys import KeyGrammar, grammar_for
from .backend import FAILED, FINISHED, Backend
from .inline import InlineWriter
from .ledger import StepLedger
from .records import (
    KEY_NAMES,
    NONFINITE_POLICIES,
    ArtifactRecord,
    ParamsRecord,
    RawLog,
    RecordRenderer,
    WarnOnce,
    collect_config,
    truncate,
)
from .worker import BackgroundWorker

__all__ = ["FAILED", "FINISHED", "TrackerLogger", "is_main_process", "save_model_to_temp"]

logger = logging.getLogger("hf_callbacks_plus")


def is_main_process(state: Any = None) -> bool:
    """True on the process that should log: world rank 0 (``state`` and env ``RANK``)."""
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        return False
    return bool(getattr(state, "is_world_process_zero", True)) if state is not None else True


#: One logger per state key and run (see `TrackerLogger._check_neighbours`).
_CLAIMS = TrainBeginClaims()

#: The ``report_to`` name of transformers' callback for each tracker.
_STOCK_REPORT_TO = {"TensorBoardCallback": "tensorboard", "MLflowCallback": "mlflow",
                    "WandbCallback": "wandb"}

#: Loggers of this process with an open run, held until it is closed (a trainer dropped after
#: ``train()`` raised must not take its logger, and the run it holds open, out of reach of the
#: exit hook and of `TrackerLogger._close_earlier_holder`).
_OPEN_LOGGERS: dict[int, TrackerLogger] = {}


def save_model_to_temp(model: Any, prefix: str) -> str:
    """Save ``model`` into a new temporary folder (``save_pretrained``, else its ``state_dict`` as
    ``model.pt``) and return the folder; the worker uploads it off the training thread."""
    folder = tempfile.mkdtemp(prefix=prefix)
    save = getattr(model, "save_pretrained", None)
    if callable(save):
        save(folder)
    else:
        import torch

        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
    return folder


def _close_at_exit(reference: weakref.ref[TrackerLogger]) -> None:
    tracker = reference()
    if tracker is None:
        return
    try:
        if tracker.training:  # on_train_end never came: the training raised (stock Trainer)
            tracker.close_after_exception()
        else:
            tracker.close(FINISHED)
    except Exception as error:  # never raise at interpreter exit
        logger.warning("%s: could not close at exit: %s", type(tracker).__name__, error)


class TrackerLogger(SelfRestoringState):
    """Base callback for experiment trackers; never blocks and never crashes training.

    Args:
        log_config: Log the ``TrainingArguments`` and the model config once, as params.
            Defaults to True.
        nonfinite: What to do with NaN/+-Inf values: ``"keep"`` logs them (the curve shows
            the divergence), ``"drop"`` drops them with one warning per key. Defaults to "keep".
        flush_timeout: Seconds to wait at train end / exception / exit for the backend to take
            the remaining records; what is still unsent goes to the spill file. Defaults to 30.
            This and the options down to ``backoff`` concern MLflow's background worker; JSONL,
            TensorBoard and W&B hand records to their library inline (W&B: ``flush_timeout``
            bounds the wait for ``wandb.init`` and ``finish`` at the end, and
            ``max_memory_points`` the records kept while ``wandb.init`` runs).
        spill_dir: Directory of the spill file. Defaults to ``<output_dir>/.tracker_spill``.
        max_memory_records: Records kept in memory (backend unreachable or slower than the
            training) before spilling to disk. Defaults to 10000.
        max_memory_points: Metric points kept in memory before spilling to disk: bounds the
            memory of heavy records (500 metrics per step), and as many again waiting in the
            queue: at most twice this while a backend call hangs (``on_log`` then spills the
            oldest queued records). Defaults to 200000 (tens of MB).
        backoff: ``(initial, max)`` retry delays in seconds. Defaults to (0.5, 30.0).
        grammar: The key grammar to render keys with. Defaults to a new ``KeyGrammar()``, which
            learns evaluation prefixes and dataset names from the metrics it sees.
        key_names: ``"sections"`` (every metric in its section: ``train/loss``, ``eval/loss``,
            ``train_subset/loss``...) or ``"stock"``: the names the stock transformers callback
            of this backend writes (MLflow: the raw keys ``loss``, ``eval_loss``; W&B and
            TensorBoard: ``rewrite_logs``' ``train/...``, ``eval/...``), for dashboards and
            queries built on them. Defaults to "sections".

    Raises:
        ValueError: An argument is out of range.
    """

    #: Capability: this callback sends logs out of the process, so `run_before_integrations`
    #: places the callbacks that fix logs ahead of it (also for subclasses defined elsewhere).
    sends_logs_out = True

    #: The tracking service; set by the subclass's ``__init__`` (None: the logger does nothing).
    backend: Optional[Backend] = None

    def __init__(
        self,
        log_config: bool = True,
        nonfinite: str = "keep",
        flush_timeout: float = 30.0,
        spill_dir: Optional[str] = None,
        max_memory_records: int = 10_000,
        backoff: tuple[float, float] = (0.5, 30.0),
        grammar: Optional[KeyGrammar] = None,
        max_memory_points: int = 200_000,
        key_names: str = "sections",
    ) -> None:
        super().__init__()
        if key_names not in KEY_NAMES:
            raise ValueError(f"key_names must be one of {KEY_NAMES}, got {key_names!r}")
        self.key_names = key_names
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if not isinstance(flush_timeout, (int, float)) or flush_timeout < 0:
            raise ValueError(f"flush_timeout must be a number >= 0, got {flush_timeout!r}")
        if not isinstance(max_memory_records, int) or max_memory_records < 1:
            raise ValueError(f"max_memory_records must be an int >= 1, got {max_memory_records!r}")
        if not isinstance(max_memory_points, int) or max_memory_points < 1:
            raise ValueError(f"max_memory_points must be an int >= 1, got {max_memory_points!r}")
        if len(backoff) != 2 or not 0 < backoff[0] <= backoff[1]:
            raise ValueError(f"backoff must be (initial, max) with 0 < initial <= max, got {backoff!r}")
        self.log_config = log_config
        self.nonfinite = nonfinite
        self.flush_timeout = float(flush_timeout)
        self.spill_dir = spill_dir
        self.max_memory_records = max_memory_records
        self.max_memory_points = max_memory_points
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self._own_grammar = grammar is not None
        self.grammar = grammar if grammar is not None else KeyGrammar()
        #: The run id given by the user (argument or environment); wins over a checkpoint's.
        self.explicit_run_id: Optional[str] = None
        #: The run id and the steps the run holds; checkpointed.
        self.ledger = StepLedger()
        self.training = False
        self._params_logged = False
        self._worker: Optional[BackgroundWorker | InlineWriter] = None
        self._trainer_ref: Optional[weakref.ref[Any]] = None
        self._output_dir: Optional[str] = None
        self._warn = WarnOnce()
        self._lifecycle_lock = threading.Lock()
        self._exit_hook: Optional[Any] = None
        #: Where the checkpoint's run was written (`local_location`, absolute), set on resume.
        self.restored_location: Optional[str] = None
        #: Records the checkpoint says were queued and not delivered when it was saved (resume).
        self._restored_pending = 0

    @property
    def run_id(self) -> Optional[str]:
        """The run id (None until the first run started); checkpointed."""
        return self.ledger.run_id

    @run_id.setter
    def run_id(self, value: Optional[str]) -> None:
        self.ledger.run_id = value

    @property
    def run_key(self) -> Optional[str]:
        """The client-made key of the run (``uuid4().hex``), fixed when the run is opened, without
        the backend; checkpointed, and set as the run tag ``hf_callbacks_plus.run_key`` where the
        store assigns run ids (MLflow), so a resume finds the run even when the checkpoint was
        saved before the store answered."""
        return self.ledger.run_key

    @run_key.setter
    def run_key(self, value: Optional[str]) -> None:
        self.ledger.run_key = value

    # -- public API --------------------------------------------------------------------
    def bind(self, trainer: Any) -> TrackerLogger:
        """Give the logger its trainer (called by every runner; see ``bind_trainer``)."""
        self.attach_trainer(trainer)
        return self

    def attach_trainer(self, trainer: Any) -> None:
        """Give the logger its trainer: eval dataset names (``eval_dataset`` dict) and model.

        Args:
            trainer: A ``transformers.Trainer``, ``TrainerPlus`` or ``LightweightTrainer``.
        """
        self._trainer_ref = weakref.ref(trainer)
        if not self._own_grammar:
            self.grammar = grammar_for(trainer)
        eval_dataset = getattr(trainer, "eval_dataset", None)
        if isinstance(eval_dataset, dict):
            for name in eval_dataset:
                self.grammar.declare_dataset(str(name))
        worker = self._worker
        if worker is not None and worker.renderer is not None:
            worker.renderer.grammar = self.grammar

    @property
    def spill_path(self) -> Path:
        """The JSONL file records are spilled to while they cannot be delivered.

        Named after `state_key` (credentials masked), with every character other than letters,
        digits, ``_``, ``.`` and ``-`` replaced by ``_``: one flat file name.
        """
        base = self.spill_dir or (
            os.path.join(self._output_dir, ".tracker_spill") if self._output_dir
            else os.path.join(tempfile.gettempdir(), "hf_callbacks_plus_spill")
        )
        return Path(base) / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.state_key)}.jsonl"

    @property
    def worker(self) -> Optional[BackgroundWorker | InlineWriter]:
        """What sends the open run's records (None when closed): a `BackgroundWorker` (MLflow), or
        an `InlineWriter` for a tracker that buffers itself (`Backend.buffers_itself`)."""
        return self._worker

    def log_file(self, path: Union[str, os.PathLike], name: str, artifact_type: str = "predictions") -> bool:
        """Queue a file for upload to the open run as an artifact (MLflow: under ``name/``; W&B: an
        artifact of type ``artifact_type`` with alias ``name``). `StreamingMetrics` uses it for its
        predictions files.

        Args:
            path: The file (copied at once: it may change afterwards).
            name: Where it goes in the run.
            artifact_type: The W&B artifact type. Defaults to ``"predictions"``.

        Returns:
            True when queued; False when this tracker keeps no files (JSONL, TensorBoard), no run
            is open, or this is not the main process.
        """
        worker = self._worker
        if worker is None or type(self.backend).log_artifact is Backend.log_artifact:
            return False
        staging = Path(self._output_dir or tempfile.gettempdir()) / ".tracker_artifacts" / name
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            shutil.copy2(path, staging / Path(path).name)
        except OSError as error:
            self._warn(("log_file", name), "%s: could not stage %s for upload (%s); not uploaded.",
                       type(self).__name__, path, error)
            return False
        worker.submit(ArtifactRecord(str(staging), [name], cleanup=True, artifact_type=artifact_type))
        return True

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every record so far reached the backend. Returns False on timeout."""
        worker = self._worker
        return True if worker is None else worker.flush(self.flush_timeout if timeout is None else timeout)

    def close(self, status: str = FINISHED, timeout: Optional[float] = None, grace: float = 5.0) -> bool:
        """Send what is left, close the run with ``status`` and stop the worker.

        Bounded: after ``timeout`` seconds (plus ``grace`` for a backend call in flight) what is
        not delivered is in the spill file, with one warning saying how to replay it.

        Args:
            status: ``"FINISHED"`` or ``"FAILED"``. Defaults to "FINISHED".
            timeout: Seconds to keep sending. Defaults to ``flush_timeout``.
            grace: Extra seconds for a backend call in flight at the deadline. Defaults to 5.

        Returns:
            True when everything was delivered and the run was closed.
        """
        if status not in (FINISHED, FAILED):
            raise ValueError(f"status must be 'FINISHED' or 'FAILED', got {status!r}")
        with self._lifecycle_lock:
            worker, self._worker = self._worker, None
            self.training = False
            _OPEN_LOGGERS.pop(id(self), None)
        if worker is None:
            return True
        return worker.close(self.flush_timeout if timeout is None else timeout, status, grace)

    # -- checkpointed state -----------------------------------------------------------
    def state_attributes(self) -> dict[str, Any]:
        """Run id and key, last delivered step per metric, records still pending, whether the config
        was logged.

        Called when a checkpoint is saved; it never waits for the backend: ``run_key`` (and, for
        backends whose ids the client chooses, ``run_id``) is fixed when the run is opened, so
        the checkpoint names the run even before the store answered (MLflow's ``run_id`` is then
        None, and the resume finds the run by its key); ``last_steps`` holds what was delivered
        so far and ``pending`` how many records were still queued (they are delivered later, or
        spilled and replayed; a resume after a hard kill says that they may be missing).
        """
        worker = self._worker
        location = self.local_location()
        return {"run_id": self.run_id, "run_key": self.run_key, "last_steps": self.ledger.last_steps(),
                "pending": 0 if worker is None else worker.pending, "params_logged": self._params_logged,
                "location": None if location is None else os.path.abspath(location)}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """Restore the run id and key and the logged steps from a checkpoint.

        The checkpoint's ``pending`` count is kept for one warning at train begin (see
        `_tell_pending`): records queued but not delivered when it was saved are lost when the
        process was killed before delivering or spilling them.
        """
        run_id = attributes.get("run_id")
        if run_id and self.explicit_run_id and run_id != self.explicit_run_id:
            logger.warning("%s: the checkpoint belongs to run %r but run id %r was given; using %r.",
                           type(self).__name__, run_id, self.explicit_run_id, self.explicit_run_id)
            return
        self.run_id = run_id or self.run_id
        self.run_key = attributes.get("run_key") or self.run_key
        try:
            self._restored_pending = max(0, int(attributes.get("pending") or 0))
        except (TypeError, ValueError):
            self._restored_pending = 0
        self.restored_location = attributes.get("location")
        self.ledger.restore(attributes.get("last_steps") or {})
        self._params_logged = bool(attributes.get("params_logged", False))

    #: Class name of transformers' ``report_to`` callback for the same tracker (a subclass sets it).
    stock_callback: Optional[str] = None

    def _check_neighbours(self, state: Any, args: Any = None) -> None:
        """Refuse a second instance with this state key in the run (they would share one
        checkpoint entry and one spill file: runs mixed on resume); warn when transformers' own
        callback for the same tracker runs too (two runs, or each point twice)."""
        name = type(self).__name__
        _CLAIMS.claim(state, self.state_key, self,
                      f"so they would share one checkpoint entry and one spill file and a resumed run "
                      f"would attach to the other's run. Use one {name} per trainer.")
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", None) or ()
        stock = [other for other in callbacks if self.stock_callback is not None
                 and type(other).__name__ == self.stock_callback
                 and type(other).__module__.startswith("transformers.integrations")]
        if stock or self._stock_in_report_to(args):
            self._warn(("stock-twin",), "%s: transformers' %s (report_to) runs in this trainer too, so the "
                       "same metrics go to the tracker twice (a second run, or a second value per step). "
                       "Set report_to='none', or call hf_callbacks_plus.replace_report_to_callbacks(trainer) "
                       "to swap it for this logger.", name, self.stock_callback)

    def _stock_in_report_to(self, args: Any) -> bool:
        """Whether ``args.report_to`` adds transformers' callback for this tracker (a stock Trainer
        not given to `run_before_integrations` shows its callbacks nowhere else)."""
        name = _STOCK_REPORT_TO.get(self.stock_callback or "")
        report_to = getattr(args, "report_to", None)
        if name is None or not report_to:
            return False
        chosen = [report_to] if isinstance(report_to, str) else list(report_to)
        if "all" in chosen:
            try:
                from transformers.integrations import get_available_reporting_integrations

                chosen = list(get_available_reporting_integrations())
            except ImportError:
                return False
        return name in chosen

    # -- events ------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Restore the run from the checkpoint, start the worker, queue the config."""
        if self.backend is None or not is_main_process(state):
            return
        self._check_neighbours(state, args)
        if self._worker is not None:
            # a run reopened by evaluate()/predict() outside training ended well (it was closed
            # FAILED, also the first, successful run of train(); evaluate(); train()); one left
            # open by a train() that never reached its end did not
            self.close(FAILED if self.training else FINISHED)
        self.ledger.new_session(self.explicit_run_id)
        self.restored_location = None
        self._restored_pending = 0
        self._params_logged = False
        super().on_train_begin(args, state, control, **kwargs)
        self.backend.resume_step = int(getattr(state, "global_step", 0) or 0) or None
        self._output_dir = getattr(args, "output_dir", None)
        self._tell_moved_location()
        self._tell_pending(state)
        self._close_earlier_holder()
        self.training = True
        self._open()
        if self.log_config and not self._params_logged:
            self._queue_config(args, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        """Copy ``logs`` and queue them; the worker renders and sends them. Returns at once."""
        if not logs or self.backend is None or not is_main_process(state):
            return
        worker = self._worker
        if worker is None:  # e.g. trainer.evaluate() after training: reopen the run
            self._output_dir = self._output_dir or getattr(args, "output_dir", None)
            worker = self._open()
        worker.submit(RawLog(dict(logs), state.global_step, int(time.time() * 1000)))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any):
        """Learn evaluation prefixes / dataset names from the metrics."""
        if metrics:
            self.grammar.learn_from_metrics(metrics)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any):
        """Log ``trainer.predict()`` metrics (``test_*`` -> ``test/...``) at the current step.

        ``predict`` logs nothing itself (no ``on_log``); the stock ``WandbCallback`` logs these
        metrics, and so do our loggers. After training, the run is reopened like for
        ``evaluate()``.
        """
        if metrics:
            self.grammar.learn_from_metrics(metrics)
            self.on_log(args, state, control, logs=dict(metrics))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """A local file (JSONL, TensorBoard) is written to disk, so what was logged before this
        checkpoint survives a crash after it; a remote store's worker is never waited for."""
        super().on_save(args, state, control, **kwargs)
        worker = self._worker
        if isinstance(worker, InlineWriter) and is_main_process(state):
            worker.flush(timeout=0)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Flush and close the run FINISHED."""
        _CLAIMS.release(state, self.state_key, self)
        if is_main_process(state):
            self.close(FINISHED)

    def on_exception(self, args: Any, state: Any, control: Any, exception: Any = None, **kwargs: Any):
        """Close the run FAILED without holding the exception back (TrainerPlus and
        LightweightTrainer fire this): at most ``min(flush_timeout, 2)`` seconds while the backend
        answers, none while it is unreachable; the rest goes to the spill file."""
        if is_main_process(state):
            self.close_after_exception()

    def close_after_exception(self) -> bool:
        """Close the run FAILED quickly: while the backend answers, wait for the run to be open (at
        most ``min(flush_timeout, backend.exception_start_wait)`` seconds: 20 for W&B, which takes
        seconds on a busy machine; 3 for MLflow, whose unsent status is replayed), then at most
        ``min(flush_timeout, 2)`` seconds for the backlog; none while it is unreachable. What is
        left goes to the spill file.

        Returns:
            True when everything was delivered and the run was closed.
        """
        worker = self._worker
        timeout = 0.0
        if worker is not None and worker.healthy:
            # the run must exist to take its status (W&B opens it in seconds); not the backlog
            worker.wait_started(min(self.flush_timeout, self.backend.exception_start_wait))
            timeout = min(self.flush_timeout, 2.0) if worker.healthy else 0.0
        return self.close(FAILED, timeout=timeout, grace=1.0)

    def explicit_location(self) -> Optional[str]:
        """The file or folder the user chose for the run (argument or environment). Defaults to None."""
        return None

    def default_location(self) -> Optional[str]:
        """Where the run goes without a choice (under ``output_dir``); None for a tracker that keeps
        runs elsewhere (MLflow, W&B). Defaults to None."""
        return None

    def local_location(self) -> Optional[str]:
        """The file or folder on this machine that holds the run (JSONL file, TensorBoard folder).

        The user's choice; else, on resume, the checkpoint's (saved in every checkpoint) when it
        exists here, so a checkpoint copied into another ``output_dir`` continues its run instead
        of splitting it in two; else `default_location`.
        """
        explicit = self.explicit_location()
        if explicit is not None:
            return explicit
        restored = self.restored_location
        if restored and os.path.exists(restored):
            return restored
        return self.default_location()

    # -- internals ---------------------------------------------------------------------
    def _tell_moved_location(self) -> None:
        """On resume, say where the run continues when that is not where this ``output_dir`` puts it."""
        restored, default = self.restored_location, self.default_location()
        if not restored or default is None or self.explicit_location() is not None:
            return
        if os.path.abspath(default) == restored:
            return
        name = type(self).__name__
        if os.path.exists(restored):
            logger.warning("%s: resuming the run kept in %s (named by the checkpoint); it continues there, "
                           "not in %s. Pass the location explicitly to write elsewhere.", name, restored,
                           default)
        else:
            logger.warning("%s: the checkpoint's run is in %s, which does not exist here; this resumed "
                           "training writes to %s, without what was logged before the checkpoint.",
                           name, restored, default)

    def _tell_pending(self, state: Any) -> None:
        """On resume, say that records the checkpoint counted as pending may be missing from the run.

        The checkpoint cannot tell whether they were delivered or spilled after it was saved: after
        a hard kill (SIGKILL, out of memory) those that were neither are lost.
        """
        pending, self._restored_pending = self._restored_pending, 0
        if pending <= 0:
            return
        run = (f"run {self.run_id}" if self.run_id is not None
               else f"the run with key {self.run_key}" if self.run_key else "the run")
        spill = self.spill_path
        spilled = ("they were waiting for the run to open; the trainer's log_history holds them"
                   if self.backend.buffers_itself else
                   f"what was spilled is replayed from {spill}" if spill.exists()
                   else f"nothing is waiting in the spill file ({spill} does not exist)")
        logger.warning("%s: the checkpoint of step %s counted %d record(s) logged before it but not yet "
                       "delivered; if the earlier process was killed before sending them, they are missing "
                       "from %s (%s).", type(self).__name__, getattr(state, "global_step", "?"), pending,
                       run, spilled)

    def _close_earlier_holder(self) -> None:
        """Close the run this logger resumes when another logger of this process still holds it.

        A stock ``Trainer`` has no exception event: after ``train()`` raised, its logger keeps the
        run open until interpreter exit. A resumed ``train()`` in the same process (a notebook, a
        retry loop) would then meet "run ID in use" (W&B), or see the first logger close the
        resumed, finished run FAILED at exit (MLflow). The earlier holder is closed now: FAILED
        when its ``train()`` never ended, and this logger reopens the run.
        """
        run_id, run_key = self.run_id, self.run_key
        if run_id is None and run_key is None:
            return
        for other in list(_OPEN_LOGGERS.values()):
            same = (run_id is not None and other.run_id == run_id) or (
                run_key is not None and other.run_key == run_key)
            if other is self or not same or other.state_key != self.state_key:
                continue
            crashed = other.training
            logger.warning("%s: run %s is still open in this process (an earlier %s whose train() %s); "
                           "closing it %s before this train() reopens it.", type(self).__name__,
                           run_id or other.run_id or f"with key {run_key}",
                           type(other).__name__, "raised" if crashed else "ended",
                           FAILED if crashed else FINISHED)
            if crashed:
                other.close_after_exception()
            else:
                other.close(FINISHED)

    def _open(self) -> BackgroundWorker | InlineWriter:
        with self._lifecycle_lock:
            if self._worker is not None:
                return self._worker
            backend = self.backend
            # the run's identity, fixed here without the backend: the checkpoint names the run
            # from the first save on (`state_attributes` never waits for the store)
            self.ledger.begin_run(backend.new_run_id)
            backend.prepare_process()
            if self._exit_hook is None:  # one hook per logger, after the backend's own
                self._exit_hook = atexit.register(_close_at_exit, weakref.ref(self))
            renderer = RecordRenderer(self.grammar, self.nonfinite, self._warn, type(self).__name__,
                                      self.key_names, backend.stock_key_style, backend.stock_summary_keys)
            if backend.buffers_itself:  # its library buffers in the background: written on this thread
                self._worker = InlineWriter(backend, self.ledger, renderer, type(self).__name__,
                                            max_memory_points=self.max_memory_points)
                _OPEN_LOGGERS[id(self)] = self
                return self._worker
            self._worker = BackgroundWorker(
                backend, self.ledger, self.spill_path, renderer=renderer, name=type(self).__name__,
                max_memory_records=self.max_memory_records, max_memory_points=self.max_memory_points,
                backoff_initial=self.backoff[0], backoff_max=self.backoff[1], target=backend.target(),
            )
            _OPEN_LOGGERS[id(self)] = self
            return self._worker

    def _queue_config(self, args: Any, model: Any) -> None:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if model is None and trainer is not None:
            model = getattr(trainer, "model", None)
        params = collect_config(args, model)
        limit = self.backend.max_param_length
        for key, value in params.items():
            if limit is not None and len(value) > limit:
                self._warn(("long-param", key), "%s: param %r is longer than %d characters; cut.",
                           type(self).__name__, key, limit)
                params[key] = truncate(value, limit)
        if params and self._worker is not None:
            self._worker.submit(ParamsRecord(params))
            self._params_logged = True
