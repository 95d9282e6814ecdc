"""``TensorBoardLogger``: TensorBoard event files, one event per record, every metric in its section."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

from .._compat import is_available, require
from .base import Backend, LogRecord
from .durable import DurableLogger

__all__ = ["TensorBoardBackend", "TensorBoardLogger", "summary_writer_class"]


def summary_writer_class() -> Any:
    """torch's ``SummaryWriter`` with tensorboard, else tensorboardX's (else ``ModuleNotFoundError``)."""
    if is_available("tensorboard") and is_available("torch"):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter
    if is_available("tensorboardX"):
        return require("tensorboardX", "TensorBoardLogger").SummaryWriter
    require("tensorboard", "TensorBoardLogger")  # raises, naming the extra
    raise ModuleNotFoundError("TensorBoardLogger needs torch with tensorboard, or tensorboardX.")


def scalar_summary_function(writer_class: Any) -> Callable[..., Any]:
    """The ``scalar(tag, value) -> Summary`` the writer class's own ``add_scalar`` uses."""
    if str(getattr(writer_class, "__module__", "")).partition(".")[0] == "tensorboardX":
        from tensorboardX.summary import scalar
    else:
        from torch.utils.tensorboard.summary import scalar
    return scalar


class TensorBoardBackend(Backend):
    """Writes scalars (curves and numeric totals) and texts (config, text values) to event files.

    Args:
        writer_class: The ``SummaryWriter`` class.
        log_dir: Returns the directory of a run, given its id.
    """

    name = "TensorBoardLogger"
    #: The writer's thread writes the event file in the background.
    durable_on_answer = False

    def __init__(self, writer_class: Any, log_dir: Callable[[str], str]) -> None:
        self._writer_class = writer_class
        self._log_dir = log_dir
        self._writer: Any = None
        self._scalar = scalar_summary_function(writer_class)
        self._summary_class = self._value_class = None
        #: Our metric name -> the tag ``add_scalar`` writes for it (tensorboardX cleans tags).
        self._tags: dict[str, str] = {}
        #: The directory of the open run.
        self.directory: Optional[str] = None
        #: Set by the logger when ``train()`` resumes: events after the checkpoint's step are purged.
        self.purge_step: Optional[int] = None

    def new_run_id(self) -> str:
        """The run's folder name (``uuid4().hex[:12]``)."""
        return uuid.uuid4().hex[:12]

    def prepare(self, run_id: Optional[str]) -> None:
        """Make the run's folder (an unwritable one is an ``OSError`` at train begin)."""
        self.directory = self._log_dir(run_id or self.new_run_id())
        os.makedirs(self.directory, exist_ok=True)

    def start(self, run_id: Optional[str], run_key: str, resume: bool) -> str:
        run_id = run_id or self.new_run_id()
        self.directory = self._log_dir(run_id)
        # only the first open of a resumed train() purges (not evaluate() after it)
        purge_step, self.purge_step = self.purge_step if resume else None, None
        self._writer = self._writer_class(log_dir=self.directory, purge_step=purge_step)
        return run_id

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """One event per record with all its scalars; texts with ``add_text``."""
        writer = self._writer
        file_writer = writer._get_file_writer()
        for record in records:
            self.handed = record.step
            walltime = record.time / 1000.0
            values = [self._value(key, value) for key, value in record.metrics.items()]
            texts = []
            for key, value in record.summary.items():
                if isinstance(value, str):
                    texts.append((key, value))
                else:
                    values.append(self._value(key, value))
            if values:
                file_writer.add_summary(self._summary_class(value=values), record.step, walltime)
            for key, value in texts:
                writer.add_text(key, value, record.step, walltime=walltime)

    def _value(self, key: str, value: float) -> Any:
        """One ``Summary.Value``, with the tag and ``simple_value`` ``add_scalar(key, value)`` writes."""
        tag = self._tags.get(key)
        if tag is None:  # once per name: the writer's own scalar() gives the tag and the classes
            template = self._scalar(key, 0.0)
            self._summary_class, self._value_class = type(template), type(template.value[0])
            tag = self._tags[key] = template.value[0].tag
        return self._value_class(tag=tag, simple_value=float(value))

    def location(self) -> str:
        """The run's folder."""
        return str(self.directory)

    def sync(self) -> bool:
        """Write what the writer holds to disk (the writer's flush waits for its queue thread)."""
        if self._writer is not None:
            self._writer.flush()
        return self._writer is not None

    def rewind(self, position: int) -> None:
        """The resumed run's writer purges the events after ``position``."""
        self.purge_step, self.position = position + 1, position

    def log_config(self, params: dict[str, str], run_id: str) -> None:
        self._writer.add_text("config", "```json\n" + json.dumps(params, indent=1, sort_keys=True) + "\n```")
        self._writer.flush()

    def finish(self, status: str, run_id: str) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.add_text("status", status)
            writer.close()


class TensorBoardLogger(DurableLogger):
    """Writes TensorBoard event files with every metric in its section, through the writer's own queue.

    Args:
        log_dir: The run's directory. Defaults to ``TENSORBOARD_LOGGING_DIR``, else
            ``<output_dir>/runs/<run id>`` (a resumed training continues it).
        **kwargs: Options of `TrackerLogger` (``log_config``, ``nonfinite``, ``key_names``...).

    Raises:
        ModuleNotFoundError: Neither tensorboard (with torch) nor tensorboardX is installed.
        TypeError: ``log_dir`` is not a path.
    """

    stock_callback = "TensorBoardCallback"
    summary_as_curves = True
    stock_key_style = "rewrite_logs"

    def __init__(self, log_dir: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"log_dir must be a str or os.PathLike, got {type(log_dir).__name__}: "
                            f"{log_dir!r}")
        self.log_dir = None if log_dir is None else str(log_dir)
        self.backend: TensorBoardBackend = TensorBoardBackend(summary_writer_class(),
                                                              lambda run_id: str(self.local_location()))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """A resumed ``train()`` purges the events the earlier process wrote after the checkpoint."""
        if self.backend is not None:
            step = int(getattr(state, "global_step", 0) or 0)
            self.backend.purge_step = step + 1 if step else None
        return super().on_train_begin(args, state, control, **kwargs)

    def explicit_location(self) -> Optional[str]:
        """``log_dir``, else ``TENSORBOARD_LOGGING_DIR``, when set."""
        chosen = self.log_dir or os.environ.get("TENSORBOARD_LOGGING_DIR")
        return os.path.expanduser(chosen) if chosen else None

    def default_location(self) -> Optional[str]:
        """``<output_dir>/runs/<run id>`` (None before the run has an id)."""
        return None if self.run_id is None else str(Path(self._output_dir or ".") / "runs" / self.run_id)

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger."""
        return {"log_dir": self.log_dir}
