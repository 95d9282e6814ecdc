"""Keep the k best checkpoints by any monitored metric, out of reach of ``save_total_limit``.

transformers keeps one best checkpoint (``best_model_checkpoint``) and its rotation deletes
the rest inside ``_save_checkpoint``, before any callback hears of the save. `KeepBestCheckpoints`
ranks every saved step by one or several metrics (each with its own k and mode, in
`EarlyStopping`'s monitor grammar) and, at ``on_save``, while the checkpoint just saved still
exists, copies the ones it keeps into ``<output_dir>/best_checkpoints/checkpoint-<step>/``,
where rotation never looks. Once kept, a checkpoint's bytes never change: a copy shares nothing
with the files transformers (or anyone) rewrites in place under ``checkpoint-*``. A kept
checkpoint leaves only when its successor is complete on disk. The pieces:

* ``ranking.py``: which steps are the k best (pure);
* ``files.py``: the kept folders and the manifest on disk (durable copies);
* ``start.py``: where a run's ranking starts (fresh, continued, or a new line after a resume
  from an earlier step, with the other line's folders set aside);
* this module: the events, the state in every checkpoint (`SelfRestoringState`), the agreement
  of the ranks, the report and the summary line.

See ``docs/best_checkpoints.md``.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Optional, Union

from ...core.checkpoint_files import kept_entries
from ...core.checkpoint_folders import checkpoint_folder
from ...core.checks import check_bool, check_choice, check_int
from ...core.stateful import SelfRestoringState
from ...metrics.keys import BEST_CHECKPOINTS_SECTION, KeyGrammar
from ...metrics.monitor import MODES, Monitor
from ...metrics.numbers import to_float
from ...runtime.console import tell
from ...runtime.distributed import from_rank0, sum_over_ranks
from ..monitoring import MonitoringCallback
from .files import (
    abandon_folder,
    begin_folder,
    building_folder,
    copy_entries,
    copy_folder,
    finish_folder,
    move_folder,
    remove_folder,
    update_folder,
    write_manifest,
)
from .ranking import Admission, Kept, TopK, admit, rankings
from .start import EARLIER_RUNS, Start, plan_start

__all__ = ["KeepBestCheckpoints", "TopK"]

logger = logging.getLogger("hf_callbacks_plus")

_OWNER = "KeepBestCheckpoints"
_FLAGS = ("resumable", "strict", "report", "verbose")
_SAME_KEY = ("the same dirname, so they would delete each other's folders. Give each its own "
             "dirname, or rank several metrics in one: KeepBestCheckpoints(['eval_loss', 'eval_accuracy']).")
MANIFEST_FORMAT = 2
_IN_PLACE = "in place"  # a keep whose folder is the one it would copy

MonitorArg = Union[None, str, TopK, Mapping[str, Any], Sequence[Union[str, TopK, Mapping[str, Any]]]]


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))


class KeepBestCheckpoints(MonitoringCallback, SelfRestoringState):
    """Keep the ``k`` best saved checkpoints by one or several metrics; rotation never deletes them.

    At every save the checkpoint's step is ranked by the values the trainer logged at that
    step (before or after the save). A checkpoint in the top k of any ranking is kept as
    ``<output_dir>/<dirname>/checkpoint-<step>/``: a durable copy of the files of the checkpoint
    just saved (copy-on-write where the file system can: no space, no time), so at most
    k + ``save_total_limit`` checkpoints' data is on disk, and a kept file never changes
    whatever is later written under ``checkpoint-*``. One that drops out of every top k is
    deleted once the checkpoint that evicts it is complete on disk; a keep that fails (a full
    disk, a quota) deletes nothing and is told. ``<dirname>/manifest.json`` lists the kept
    steps, their values and ranks.

    As ``load_best_model_at_end``: NaN never ranks, the best infinity (+Inf in ``"max"`` mode)
    ranks first, the worst never ranks, and a tie keeps the earlier step. The state is in every
    checkpoint and is checked against the disk on resume; a resume from an earlier step starts a
    new ranking and sets the other line's kept checkpoints aside (never deletes them).

    Args:
        monitor: The metric(s): a name in `EarlyStopping`'s grammar (``"eval_loss"``,
            ``"eval_<dataset>_accuracy"``, ``"train_subset_accuracy"``, ``"loss"``, trl's
            ``"eval_rewards/margins"``, a rendered ``"eval/accuracy"``), a `TopK` (its own k
            and mode), or a list of them. Defaults to None: ``args.metric_for_best_model``.
        k: How many to keep per metric given as a name (>= 1). Defaults to 1.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (from the name; with ``monitor=None`` from
            ``args.greater_is_better``), for metrics given as names. Defaults to ``"auto"``.
        dirname: The folder in ``output_dir`` that holds the kept checkpoints (one name, not
            ``checkpoint-*``). Defaults to ``"best_checkpoints"``.
        resumable: Keep exactly what the trainer's resume reads (the optimizer, scheduler, AMP
            scaler and RNG states; under DeepSpeed and FSDP the engine's own files), so a kept
            checkpoint can be resumed from (about 3 x the model's size with Adam); refused with
            ``args.save_only_model=True``, which saves none of them. Defaults to False: the
            model once (or the peft adapter), as the trainer wrote it (consolidated, or the
            engine's shards when it wrote no consolidated weights), its config, tokenizer and
            ``trainer_state.json``.
        strict: Raise when a metric cannot show up or saves and evaluations never meet, as
            early as that is known (train begin, the first evaluation); False warns once and
            keeps training. Defaults to True.
        report: Add the ranking to the end-of-training record, in the ``best_checkpoints/``
            run-summary section (``best_checkpoints/eval_loss/rank1_step`` and
            ``.../rank1_value``), which our loggers send to the run summary. Defaults to True.
        verbose: Print the kept checkpoints at train end (main process). Defaults to True.

    Raises:
        TypeError, ValueError: At construction and train begin for bad arguments (a misspelt
            metric gets a "did you mean"); at train begin for a metric the run cannot produce,
            saves that never meet an evaluation, ``resumable=True`` with
            ``save_only_model=True``, two instances with one ``dirname``, or a fresh run whose
            ``dirname`` holds another run's kept checkpoints.

    Example:
        >>> keeper = KeepBestCheckpoints("eval_loss", k=3)
        >>> keeper.state_key
        'KeepBestCheckpoints[best_checkpoints]'
        >>> both = KeepBestCheckpoints([TopK("eval_rewards/accuracies", k=2), TopK("eval_rewards/margins")])
    """

    #: Said after a missing metric's message.
    without_it = " Without it no checkpoint is ranked by it."

    def __init__(self, monitor: MonitorArg = None, k: int = 1, mode: str = "auto", *,
                 dirname: str = "best_checkpoints", resumable: bool = False, strict: bool = True,
                 report: bool = True, verbose: bool = True, earlier_runs: str = "set_aside") -> None:
        self.monitor, self.k, self.mode, self.dirname = monitor, k, mode, dirname
        self.resumable, self.strict, self.report, self.verbose = resumable, strict, report, verbose
        self.earlier_runs = earlier_runs
        super().__init__()
        self.specs: list[TopK] = []
        self._check_settings()
        self.reset()

    # -- settings ------------------------------------------------------------------------
    def _requested(self) -> list[TopK]:
        """The rankings as given (modes not resolved yet); [] for ``monitor=None``."""
        k, mode, monitor = self.k, self.mode, self.monitor
        check_int(_OWNER, "k", k, minimum=1, meaning="how many checkpoints to keep")
        check_choice(_OWNER, "mode", mode, MODES)
        if monitor is None:
            return []
        items = [monitor] if isinstance(monitor, (str, TopK, Mapping)) else monitor
        if not isinstance(items, Sequence) or not items:
            raise TypeError(f"{_OWNER}: monitor must be a metric name, a TopK, a non-empty list of them or "
                            f"None (args.metric_for_best_model), got {monitor!r}.")
        specs = []
        for item in items:
            if isinstance(item, Mapping):
                try:
                    item = TopK(**item)
                except TypeError as error:
                    raise TypeError(f"{_OWNER}: a monitor given as a dict takes the keys 'monitor', 'k' and "
                                    f"'mode', got {dict(item)!r} ({error}).") from None
            spec = TopK(item, k, mode) if isinstance(item, str) else item
            if not isinstance(spec, TopK) or not isinstance(spec.monitor, str) or not spec.monitor:
                raise TypeError(f"{_OWNER}: each monitor must be a non-empty metric name or a TopK, "
                                f"got {item!r}.")
            check_int(_OWNER, f"TopK({spec.monitor!r}) k", spec.k, minimum=1)
            check_choice(_OWNER, f"TopK({spec.monitor!r}) mode", spec.mode, MODES)
            specs.append(spec)
        return specs

    def _check_settings(self, args: Any = None) -> None:
        """Validate every setting and resolve the rankings (from ``args`` for ``monitor=None``).
        Called at construction and at train begin."""
        for name in _FLAGS:
            check_bool(_OWNER, name, getattr(self, name))
        check_choice(_OWNER, "earlier_runs", self.earlier_runs, EARLIER_RUNS)
        dirname = self.dirname
        if not isinstance(dirname, str) or not dirname or dirname in (".", "..") or os.path.isabs(dirname) \
                or "/" in dirname or os.sep in dirname or dirname.startswith("checkpoint"):
            raise ValueError(f"{_OWNER}: dirname must be one folder name inside output_dir that does not "
                             f"start with 'checkpoint' (transformers' rotation and resume look at "
                             f"checkpoint-*), got {dirname!r}. E.g. dirname='best_checkpoints'.")
        if args is not None and self.resumable and getattr(args, "save_only_model", False):
            raise ValueError(f"{_OWNER}: resumable=True keeps what a resume needs, but "
                             f"args.save_only_model=True saves no optimizer, scheduler or RNG state into "
                             f"checkpoints, so no kept checkpoint could be resumed from. Set "
                             f"save_only_model=False, or resumable=False (the model only).")
        requested = self._requested()
        monitors: list[Monitor] = []
        if requested:
            for spec in requested:
                monitor = Monitor(spec.monitor, mode=spec.mode, grammar=self.grammar, owner=_OWNER)
                if spec.mode != "auto":
                    monitor.warn_if_misspelt()
                monitors.append(monitor)
        elif args is not None:
            monitors.append(Monitor.from_args(args, mode=self.mode, grammar=self.grammar, owner=_OWNER))
            requested = [TopK(monitors[0].monitor, self.k, self.mode)]
        specs = [TopK(self.grammar.canonical(monitor.monitor), spec.k, monitor.mode)
                 for monitor, spec in zip(monitors, requested)]
        names = [spec.monitor for spec in specs]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"{_OWNER}: the metric(s) {twice} are listed twice; give each metric once "
                             f"(a TopK sets its own k and mode).")
        self._monitors, self.specs = monitors, specs

    # -- state ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the ranking (called at every train begin, before a resume restores it)."""
        self.entries: tuple[Kept, ...] = ()
        self.run_id: Optional[str] = None
        self.output_dir: Optional[str] = None
        self.last_step: Optional[int] = None
        self.directory: Optional[str] = None
        self.not_kept: list[dict[str, Any]] = []
        self._state: Any = None
        self._writer = False
        self._rank_index, self._world = 0, 1
        self._fresh: Optional[int] = None
        self._pending: Optional[int] = None
        self._confirmed: set[str] = set()
        self._unranked: list[int] = []

    @property
    def state_key(self) -> str:
        """``KeepBestCheckpoints[<dirname>]``: one instance per folder."""
        return f"{_OWNER}[{self.dirname}]"

    @state_key.setter
    def state_key(self, value: str) -> None:
        """Ignored (derived)."""

    def state_args(self) -> dict[str, Any]:
        monitor = self.monitor
        if isinstance(monitor, TopK):
            monitor = asdict(monitor)
        elif isinstance(monitor, Sequence) and not isinstance(monitor, str):
            monitor = [asdict(item) if isinstance(item, TopK) else dict(item) if isinstance(item, Mapping)
                       else item for item in monitor]
        return {"monitor": monitor, "k": self.k, "mode": self.mode, "dirname": self.dirname,
                "earlier_runs": self.earlier_runs, **{name: getattr(self, name) for name in _FLAGS}}

    def state_attributes(self) -> dict[str, Any]:
        """The ranking as it stands: through the previous save (the trainer asks for the state
        inside ``_save_checkpoint``, before ``on_save`` ranks the checkpoint being saved; a resume
        ranks that step again from its ``log_history``). ``kept``: the steps kept once this
        checkpoint is ranked, if its keep succeeds (for readers such as the plot)."""
        kept = self.entries
        candidate = self._candidate(self._state, self.last_step)
        if candidate is not None:
            kept = admit(kept, candidate, self.specs).kept
        return {"run_id": self.run_id, "output_dir": self.output_dir, "last_step": self.last_step,
                "entries": [entry.to_json() for entry in self.entries],
                "kept": [entry.step for entry in kept if not entry.missing]}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        self.run_id = attributes.get("run_id")
        self.output_dir = attributes.get("output_dir")
        self.last_step = attributes.get("last_step")
        self.entries = tuple(Kept.from_json(entry) for entry in attributes.get("entries") or [])

    # -- what is kept --------------------------------------------------------------------
    @property
    def ranking(self) -> dict[str, list[Kept]]:
        """Each monitored metric's kept checkpoints, best first."""
        return rankings(self.entries, self.specs)

    def folder(self, step: int) -> Optional[str]:
        """The kept folder of ``step`` (None before train begin)."""
        return None if self.directory is None else checkpoint_folder(self.directory, step)

    @property
    def best_checkpoint(self) -> Optional[str]:
        """The kept folder of the best step by the first metric, or None."""
        best = next(iter(self.ranking.values()), [])
        return self.folder(best[0].step) if best and not best[0].missing else None

    def manifest(self, entries: Optional[Sequence[Kept]] = None) -> dict[str, Any]:
        """The content of ``manifest.json`` (for ``entries``, by default the current ones)."""
        entries = self.entries if entries is None else tuple(entries)
        ranked = rankings(entries, self.specs)
        checkpoints = []
        for entry in entries:
            ranks = {name: [e.step for e in kept].index(entry.step) + 1 for name, kept in ranked.items()
                     if entry.step in [e.step for e in kept]}
            checkpoints.append({**entry.to_json(), "path": os.path.basename(self.folder(entry.step) or ""),
                                "ranks": ranks})
        return {"format": MANIFEST_FORMAT, "run_id": self.run_id, "output_dir": self.output_dir,
                "last_step": self.last_step, "monitors": [asdict(spec) for spec in self.specs],
                "ranking": {name: [entry.step for entry in kept] for name, kept in ranked.items()},
                "checkpoints": checkpoints, "not_kept": list(self.not_kept)}

    # -- reading the metrics of a step ---------------------------------------------------
    def _record_of(self, state: Any) -> dict[str, Any]:
        """Every key the trainer logged at the current step (the latest value of each)."""
        step, merged = getattr(state, "global_step", None), {}
        for record in reversed(getattr(state, "log_history", None) or []):
            if not isinstance(record, Mapping) or record.get("step") != step:
                break
            for key, value in record.items():
                merged.setdefault(key, value)
        return merged

    def _candidate(self, state: Any, after: Optional[int]) -> Optional[Kept]:
        """The current step with its monitored values, if it logged any and comes ``after``."""
        if state is None or not self.specs:
            return None
        step = int(getattr(state, "global_step", 0))
        if after is not None and step <= after:
            return None
        record = self._record_of(state)
        values = {}
        for spec, monitor in zip(self.specs, self._monitors):
            key, raw = self.lookup(monitor, record, from_evaluate=False)
            if key is None:
                continue
            value = to_float(raw)
            values[spec.monitor] = math.nan if value is None else value
        if not values:
            return None
        epoch = getattr(state, "epoch", None)
        return Kept(step, values, None if epoch is None else float(epoch))

    # -- train begin ---------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Check the settings and the run, then restore and reconcile the ranking, or start one."""
        self.reset()
        self._check_settings(args)
        self.watch_begin(args, state, claim=_SAME_KEY)
        # the main process writes the kept folders and the manifest; every rank copies the files it
        # wrote (its ZeRO partition, its distributed-checkpoint shard, its RNG state)
        self._writer = bool(getattr(state, "is_world_process_zero", True))
        self._rank_index = int(getattr(args, "process_index", 0) or 0)
        self._world = max(1, int(getattr(args, "world_size", 1) or 1))
        output_dir = os.path.realpath(os.fspath(args.output_dir))
        self.directory = os.path.join(output_dir, self.dirname)
        self._state = state
        # (no super().on_train_begin: the saved state is one of the inputs of plan_start)
        step = int(getattr(state, "global_step", 0))
        saved = self.find_saved_state(state) if step > 0 else None
        candidate = self._candidate(state, None)
        history = list(getattr(state, "log_history", None) or [])
        start = from_rank0(lambda: plan_start(saved, step, history, candidate, output_dir, self.directory,
                                              self.earlier_runs))
        if start.problem is not None:
            raise RuntimeError(start.problem)
        if getattr(state, "is_world_process_zero", True):
            for warning in start.warnings:
                logger.warning(warning)
            for note in start.notes:
                logger.info(note)
        self.run_id, self.output_dir, self.entries = start.run_id, start.output_dir, start.entries
        self.last_step = start.last_step
        local = self._prepare(start) if self._writer else ([], None)
        lost, error = from_rank0(lambda: local)
        if error is not None:
            raise RuntimeError(error)
        self._lose(lost)
        if start.candidate is not None:
            self._rank(start.candidate, start.sources.get(step) or self._in_place(step))
        self.last_step = max(self.last_step or 0, step)
        if self._writer:
            self._commit(self.entries)
        self.keep_trainer_state_current(args, state)

    def _prepare(self, start: Start) -> tuple[list[int], Optional[str]]:
        """Make the disk match the ranking the run starts from (on the processes that write; no
        collective): set another line's folders aside, delete this line's leftovers, make the
        kept folders a crash left unmade. Returns the steps that could not be made, and why the
        run cannot start (or None)."""
        aside = start.set_aside
        if aside is not None:
            try:
                os.makedirs(aside.path, exist_ok=True)
                if aside.manifest is not None:
                    write_manifest(aside.path, aside.manifest)
                for step in aside.copy:
                    copy_folder(self.folder(step), checkpoint_folder(aside.path, step))
                for step in aside.move:
                    move_folder(self.folder(step), checkpoint_folder(aside.path, step))
            except OSError as error:
                return [], (f"{_OWNER}: could not set the kept checkpoints of another run aside into "
                            f"{aside.path} ({type(error).__name__}: {error}); nothing was deleted. Free the "
                            f"space, or move {self.directory} away yourself, then start again.")
        for path in start.cleanup:
            shutil.rmtree(path, ignore_errors=True)
        for step in start.remove:
            self._remove(step)
        lost = []
        for step, source in sorted(start.sources.items()):
            if start.candidate is not None and step == start.candidate.step:
                continue
            problem = self._make(step, source)
            if problem is None:
                logger.info("%s: made the kept folder of step %s from %s (the run stopped before it was "
                            "made, or it was deleted since).", _OWNER, step, source)
            else:
                logger.warning("%s: could not make the kept folder of step %s from %s (%s); it keeps its "
                               "place, marked missing.", _OWNER, step, source, problem)
                lost.append(step)
        return lost, None

    def _make(self, step: int, source: str) -> Optional[str]:
        """Make a kept folder in this process alone (a repair at train begin); None, or why not."""
        try:
            copy_folder(source, self.folder(step), kept_entries(source, self.resumable))
        except OSError as error:
            return f"{type(error).__name__}: {error}"
        return None

    def _in_place(self, step: int) -> Optional[str]:
        folder = self.folder(step)
        return folder if folder is not None and os.path.isdir(folder) else None

    def run_problem(self, args: Any, monitor: Monitor) -> Optional[str]:
        """Why no saved checkpoint would ever have the metric, or None."""
        save = _text(getattr(args, "save_strategy", "steps"))
        if save == "no":
            return (f"{_OWNER}: args.save_strategy='no' saves no checkpoint, so there is nothing to keep. "
                    f"Set save_strategy='steps' or 'epoch'.")
        loop = monitor.prefix == ""
        if save == "best" and not loop:
            return None
        what = "logging" if loop else "eval"
        strategy = _text(getattr(args, f"{what}_strategy", "no"))
        if strategy != save:
            return (f"{_OWNER}: {monitor.monitor!r} comes with every {what} ({what}_strategy={strategy!r}) "
                    f"but checkpoints are saved by save_strategy={save!r}, so saves and values rarely meet. "
                    f"Use the same strategy for both (load_best_model_at_end requires it too).")
        every = getattr(args, f"{what}_steps", None) or getattr(args, "logging_steps", None)
        saves = getattr(args, "save_steps", None)
        if save == "steps" and isinstance(every, (int, float)) and isinstance(saves, (int, float)) \
                and every >= 1 and saves >= 1 and saves % every:
            return (f"{_OWNER}: save_steps={saves} is not a multiple of {what}_steps={every}, so some saved "
                    f"checkpoints have no {monitor.monitor!r} to be ranked by. Make save_steps a multiple of "
                    f"{what}_steps.")
        return None

    # -- one keep ------------------------------------------------------------------------
    def _keep(self, step: int, source: Optional[str]) -> Optional[str]:
        """Make the kept folder of ``step`` a complete copy of what `kept_entries` chooses of
        ``source``; None, or why it failed (then nothing of it is left). A collective: every rank
        calls it, copies the files it wrote, and gets the same answer."""
        target = self.folder(step)
        status = from_rank0(lambda: self._begin(step, source, target))
        if status == _IN_PLACE:
            return None
        if status is not None:
            return status
        building, local = building_folder(target), None
        try:
            entries = [entry for entry in kept_entries(source, self.resumable, self._world)
                       if entry.owner == self._rank_index]
            copied = copy_entries(source, building, entries)
            logger.debug("%s: copied %d files (%d bytes, %d shared copy-on-write) of checkpoint-%s on rank "
                         "%d.", _OWNER, copied.files, copied.bytes, copied.shared, step, self._rank_index)
        except OSError as error:
            local = f"{type(error).__name__}: {error}"
            if self._rank_index != 0:
                logger.warning("%s: rank %d could not copy its files of checkpoint-%s: %s.", _OWNER,
                               self._rank_index, step, local)
        flags = sum_over_ranks([1.0 if local and rank == self._rank_index else 0.0
                                for rank in range(self._world)])
        failed = [rank for rank, flag in enumerate(flags) if flag]
        return from_rank0(lambda: self._finish(step, building, target, failed, local))

    def _begin(self, step: int, source: Optional[str], target: str) -> Optional[str]:
        """On the main process: check ``source`` and make the folder the copy is built in."""
        if source is None:
            return (f"no save of step {step} of this run is left to keep it from (its checkpoint-{step} "
                    f"is not in output_dir, or is another run's)")
        if os.path.realpath(source) == os.path.realpath(target):
            return _IN_PLACE  # already kept (the folder a run resumes from)
        if not os.path.isdir(source):
            return (f"{source} was gone at on_save: transformers' save_total_limit rotation deleted it "
                    f"(it keeps the newest checkpoints by mtime, or by step when their mtimes are within "
                    f"1 s, so higher checkpoint-N of an earlier run, or of the steps a resumed run trains "
                    f"again, outrank it)")
        try:
            begin_folder(target)
        except OSError as error:
            return f"{type(error).__name__}: {error}"
        return None

    def _finish(self, step: int, building: str, target: str, failed: Sequence[int],
                local: Optional[str]) -> Optional[str]:
        """On the main process: rename the complete copy into place, or delete what was made."""
        if failed:
            abandon_folder(building)
            return local if 0 in failed else (f"rank(s) {failed} could not copy their files of "
                                               f"checkpoint-{step} (their output says why)")
        existed = os.path.isdir(target)
        try:
            finish_folder(building, target)
        except OSError as error:
            abandon_folder(building)
            if not existed and os.path.isdir(target):  # renamed into place, then the disk failed
                self._remove(step)
            return f"{type(error).__name__}: {error}"
        logger.debug("%s: kept checkpoint-%s in %s.", _OWNER, step, self.directory)
        return None

    def _commit(self, entries: Sequence[Kept]) -> Optional[str]:
        """Write the manifest for ``entries``; None, or why it failed (the old one stays)."""
        try:
            write_manifest(self.directory, self.manifest(entries))
        except OSError as error:
            return f"{type(error).__name__}: {error} (writing {self.directory}/manifest.json)"
        return None

    def _rank(self, candidate: Kept, source: Optional[str]) -> None:
        """Rank ``candidate``; keep it when it is in a top k; delete the evicted only once its kept
        folder and the manifest that lists it are on disk. A failed keep changes nothing."""
        admission = admit(self.entries, candidate, self.specs)
        problem = self._keep(candidate.step, source) if admission.admitted else None
        if problem is None and self._writer:
            problem = self._commit(admission.kept)
            if problem is not None and admission.admitted:
                self._remove(candidate.step)
        problem = from_rank0(lambda: problem)
        if problem is not None and admission.admitted:
            self._not_kept(candidate, admission, problem)
            return
        if problem is not None:
            logger.warning("%s: %s.", _OWNER, problem)
        self.entries = admission.kept
        if self._writer:
            for entry in admission.evicted:
                if not entry.missing:
                    self._remove(entry.step)
        self._fresh = candidate.step if admission.admitted else None

    def _not_kept(self, candidate: Kept, admission: Admission, problem: str) -> None:
        ranks = {name: [e.step for e in kept].index(candidate.step) + 1
                 for name, kept in rankings(admission.kept, self.specs).items()
                 if candidate.step in [e.step for e in kept]}
        self.not_kept.append({**candidate.to_json(), "ranks": ranks, "reason": problem})
        if self._writer:
            self._commit(self.entries)
            stays = "; ".join(f"{name}: steps {[e.step for e in kept]}"
                              for name, kept in self.ranking.items())
            logger.warning("%s: could not keep %s, which would rank %s, in %s: %s. Nothing was deleted: the "
                           "kept checkpoints stay as they were (%s).", _OWNER, candidate.describe(), ranks,
                           self.directory, problem, stays or "none yet")

    def _lose(self, steps: Sequence[int]) -> None:
        """Mark the entries of ``steps`` missing (their kept folder could not be made)."""
        self.entries = tuple(entry.lost() if entry.step in steps else entry for entry in self.entries)

    def _remove(self, step: int) -> None:
        try:
            remove_folder(self.directory, step)
        except (OSError, ValueError) as error:
            logger.warning("%s: could not delete the kept checkpoint-%s from %s (%s: %s).", _OWNER, step,
                           self.directory, type(error).__name__, error)

    def _settle(self) -> None:
        """The save of the last step is over: copy what callbacks after this one wrote into the
        checkpoint just kept (their state on transformers < 4.45), before the next save can rotate
        it away; a save whose step logged no value is unranked."""
        step, self._fresh = self._fresh, None
        if step is not None and self._writer and os.path.isdir(self.folder(step)):
            source = checkpoint_folder(self.output_dir, step)
            if os.path.isdir(source):
                try:
                    entries = [entry for entry in kept_entries(source, self.resumable, self._world)
                               if entry.owner == 0]
                    update_folder(source, self.folder(step), entries)
                except OSError as error:
                    logger.warning("%s: could not copy what was written into checkpoint-%s after our "
                                   "on_save (%s: %s); its kept folder holds the checkpoint as it was then.",
                                   _OWNER, step, type(error).__name__, error)
        pending, self._pending = self._pending, None
        if pending is not None and pending not in self._unranked:
            self._unranked.append(pending)

    def _rank_pending(self, args: Any, state: Any) -> None:
        """Values logged after the save of their step (an evaluation by epoch after a save by steps
        at the epoch's last step) rank that save, while its checkpoint-N still exists."""
        if self._pending is None or self._pending != getattr(state, "global_step", None):
            return
        candidate = from_rank0(lambda: self._candidate(state, None))
        if candidate is not None:
            self._pending = None
            self._rank(candidate, checkpoint_folder(self.output_dir, candidate.step))
            self.keep_trainer_state_current(args, state)

    # -- events --------------------------------------------------------------------------
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._state = state

    on_epoch_end = on_step_end

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The save of the previous step is over (see `_settle`)."""
        super().on_step_begin(args, state, control, **kwargs)
        self._settle()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """Check the first evaluation holds the metrics; rank a save waiting for them."""
        self._state = state
        self.check_record(metrics, True, state, control)
        self._rank_pending(args, state)

    def observe_record(self, args: Any, state: Any, control: Any, logs: dict, **kwargs: Any) -> None:
        """Check the first training record holds a training-loop metric; add the ranking to the
        end-of-training record (with a stock Trainer at ``on_log``: the callbacks after this one,
        our loggers, see it)."""
        self._state = state
        if not KeyGrammar.is_summary_record(logs):
            self.check_record(logs, False, state, control)
        elif self.report and self.specs:
            logs.update(self.summary())

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """`observe_record` (when ``on_pre_log`` did not); then rank a save waiting for the values
        just logged."""
        super().on_log(args, state, control, logs=logs, **kwargs)
        if isinstance(logs, dict) and not KeyGrammar.is_summary_record(logs):
            self._rank_pending(args, state)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Rank the checkpoint just saved; keep it (a copy) if it is in a top k; delete the evicted."""
        self._state = state
        super().on_save(args, state, control, **kwargs)  # transformers < 4.45: our state, before this save
        if self._pending is not None:
            self._settle()
        step = int(state.global_step)
        candidate = from_rank0(lambda: self._candidate(state, self.last_step))
        if self.last_step is None or step > self.last_step:
            self.last_step = step
        if candidate is not None:
            self._rank(candidate, checkpoint_folder(self.output_dir, step))
        else:
            if self.specs:
                self._pending = step
            if self._writer:
                self._commit(self.entries)
        self.keep_trainer_state_current(args, state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Settle the last save; warn about unranked or unkept saves; print the kept checkpoints;
        raise the refusal training stopped for."""
        self._settle()
        self._state = None
        if self._unranked and self.specs:
            logger.warning("%s: %d saved checkpoint(s) (steps %s) had no value of %s and were not ranked.",
                           _OWNER, len(self._unranked), _short(self._unranked),
                           [spec.monitor for spec in self.specs])
        if self.not_kept and self._writer:
            logger.warning("%s: %d checkpoint(s) that ranked could not be kept (steps %s; reasons in %s's "
                           "'not_kept').", _OWNER, len(self.not_kept),
                           _short([e["step"] for e in self.not_kept]),
                           os.path.join(self.directory or "", "manifest.json"))
        if self.verbose and self.specs:
            tell(self.summary_message(), state, verbose=True)
        self.watch_end(args, state, claim=True)

    # -- reporting -----------------------------------------------------------------------
    def summary(self) -> dict[str, float]:
        """The ranking as run-summary keys: ``best_checkpoints/<metric>/rank<i>_step`` and ``_value``."""
        out: dict[str, float] = {}
        for name, kept in self.ranking.items():
            for rank, entry in enumerate(kept, 1):
                out[f"{BEST_CHECKPOINTS_SECTION}/{name}/rank{rank}_step"] = entry.step
                out[f"{BEST_CHECKPOINTS_SECTION}/{name}/rank{rank}_value"] = entry.values[name]
        return out

    def summary_message(self) -> str:
        """One line per metric: the kept steps, best first, with their values."""
        lines = [f"{_OWNER}: kept in {self.directory}:"]
        for spec in self.specs:
            kept = self.ranking.get(spec.monitor, [])
            listed = ", ".join(entry.describe(spec.monitor) for entry in kept) or "none (no finite value)"
            lines.append(f"  {spec.monitor} ({spec.mode}, k={spec.k}): {listed}")
        return "\n".join(lines)


def _short(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")

