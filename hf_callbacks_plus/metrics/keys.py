"""The log-key grammar: raw Trainer log keys <-> (section, dataset, name) <-> tracker names.

One module decides where every key belongs; loggers, ``EarlyStopping``, the train-subset
evaluation and plotting all use it, so a metric has the same identity everywhere, and no
rendered name means two things.

Raw keys (what ``Trainer.log`` receives) and how they render:

=====================================  ==========================  ============================
raw key                                section / dataset           rendered
=====================================  ==========================  ============================
``loss``, ``learning_rate``,           train / -                   ``train/loss`` ...
``grad_norm``, ``epoch``, any bare key
trl running metrics: ``rewards/chosen``,  train / -                ``train/rewards/chosen``,
``logps/...``, ``mean_token_accuracy``                             ``train/mean_token_accuracy``
``eval_loss``, ``eval_rewards/chosen``  eval / -                   ``eval/loss``, ``eval/rewards/chosen``
``eval_squad_f1`` (dataset ``squad``   eval / squad                ``eval/squad/f1``
known)
``test_f1`` (``predict``)              test / -                    ``test/f1``
``train_subset_accuracy``              train_subset / -            ``train_subset/accuracy``
(``TrainSubsetEvaluation``)
``gap_loss`` (train subset minus eval)  gap / -                    ``gap/loss``
``early_stopping/best_value``          early_stopping / -          unchanged
``best_checkpoints/eval_loss/rank1_step``  best_checkpoints / -    unchanged (run summary)
``val_acc`` (prefix ``val`` learned    val / -                     ``val/acc``
or declared)
end-of-training record: ``train_loss``,  train_summary / -         ``train_summary/loss``,
``train_runtime``, ``total_flos``,                                 ``train_summary/runtime``,
``epoch``                                                          ``train_summary/total_flos`` ...
``train_accuracy`` elsewhere (the      train_subset / -            ``train_subset/accuracy``
stock ``evaluate(train_ds,
metric_key_prefix="train")`` workaround)
``eval/loss`` (pre-rendered: a known   eval / -                    unchanged
section, then ``/``)
=====================================  ==========================  ============================

So ``train/`` holds only what the training loop measures on its batches (trl's running
metrics included), ``train_subset/`` what an evaluation measured on training data, and
``train_summary/`` the run totals of the final record.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "BEST_CHECKPOINTS_SECTION",
    "BUILTIN_SECTIONS",
    "METRIC_FAMILIES",
    "NESTED_SEPARATOR",
    "RUN_COUNTERS",
    "SPEED_SUFFIXES",
    "SUMMARY_KEYS",
    "SUMMARY_SECTION",
    "TIMING_NAMES",
    "TRAINING_LOOP_KEYS",
    "TRAIN_SUBSET_PREFIX",
    "KeyGrammar",
    "MetricKey",
    "add_prefix",
    "did_you_mean",
    "evaluation_prefix",
    "flatten_metrics",
    "grammar_for",
    "is_training_record",
]

logger = logging.getLogger("hf_callbacks_plus")

#: Separator used when flattening nested metric dicts.
NESTED_SEPARATOR = "."


def flatten_metrics(metrics: Mapping[str, Any], separator: str = NESTED_SEPARATOR) -> dict[str, Any]:
    """Flatten nested dicts returned by ``compute_metrics``.

    Args:
        metrics: A possibly nested mapping, e.g. ``{"f1": {"macro": 0.5}}``.
        separator: Joins nested names. Defaults to ``"."``.

    Returns:
        A flat dict, e.g. ``{"f1.macro": 0.5}``. When two entries flatten to the same name
        (``{"f1.macro": 1, "f1": {"macro": 2}}``) the later one gets a ``_`` suffix and a
        warning is logged: no value is dropped silently.
    """
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        key = key if type(key) is str else str(key)
        if type(value) is not float and isinstance(value, Mapping):  # floats first: the common case
            for sub_key, sub_value in flatten_metrics(value, separator).items():
                _put_unique(flat, f"{key}{separator}{sub_key}", sub_value)
        elif key in flat:
            _put_unique(flat, key, value)
        else:
            flat[key] = value
    return flat


def _put_unique(flat: dict[str, Any], key: str, value: Any) -> None:
    if key in flat:
        unique = key + "_"
        while unique in flat:
            unique += "_"
        logger.warning(
            "Nested metrics flatten to the same name %r; logging the later one as %r.", key, unique
        )
        key = unique
    flat[key] = value


def add_prefix(metrics: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Prefix metric names like ``Trainer.evaluate`` does, never doubling the prefix.

    Args:
        metrics: Metric names to values (nested dicts are flattened).
        prefix: ``"eval"``, ``"train"``, ``"eval_squad"``...

    Returns:
        ``{"<prefix>_<name>": value}``; a name that already starts with ``<prefix>_`` is
        kept as is, so ``eval_eval_loss`` is never produced.
    """
    out: dict[str, Any] = {}
    flat = flatten_metrics(metrics)
    for key, value in flat.items():
        target = key if key.startswith(f"{prefix}_") else f"{prefix}_{key}"
        if target in out or (target != key and target in flat):
            logger.warning(
                "add_prefix: %r and %r both name %r; keeping the value already prefixed.",
                key, target, target,
            )
            continue
        out[target] = value
    return out


def did_you_mean(wanted: str, available: Iterable[str], limit: int = 3) -> list[str]:
    """Return up to ``limit`` keys from ``available`` that look like ``wanted``."""
    available = list(available)
    matches = difflib.get_close_matches(wanted, available, n=limit, cutoff=0.5)
    if not matches:
        tail = wanted.split("_")[-1].split("/")[-1]
        matches = [key for key in available if key.endswith(tail)][:limit]
    return matches


#: Keys the training loop itself logs without a prefix.
TRAINING_LOOP_KEYS = frozenset(
    {"loss", "learning_rate", "grad_norm", "epoch", "num_input_tokens_seen", "num_tokens"}
)

#: Counters of training progress a trainer's ``log`` attaches to its records (trl's ``num_tokens``:
#: tokens trained on so far, in evaluation records too): not measurements of the evaluated data and
#: not learning curves.
RUN_COUNTERS = ("num_tokens", "num_input_tokens_seen")

#: First segments of metric names that contain ``/`` without being rendered keys: trl's
#: ``rewards/chosen``, ``logps/rejected``, ``logits/chosen`` (DPO), ``completions/mean_length``,
#: ``clip_ratio/low_mean``, ``sampling/...``, ``tools/...`` (GRPO), ``rewards/<func>/mean``.
METRIC_FAMILIES = frozenset(
    {"rewards", "logps", "logits", "completions", "clip_ratio", "sampling", "tools", "vespo"}
)

#: Prefix of the train-subset metrics (``TrainSubsetEvaluation``): ``train_subset_<name>``.
TRAIN_SUBSET_PREFIX = "train_subset"

#: Section of the run totals in the end-of-training record.
SUMMARY_SECTION = "train_summary"

#: Keys of the end-of-training record (``Trainer.train`` output); they are run totals.
SUMMARY_KEYS = frozenset(
    {
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "train_tokens_per_second",
        "train_loss",
        "total_flos",
        "train_skipped",  # a resumed run vetoed by on_resume_check (core.resume_check)
    }
)

#: Section of the ranking of ``KeepBestCheckpoints`` (``best_checkpoints/eval_loss/rank1_step``): a
#: run summary, like ``train_summary/``.
BEST_CHECKPOINTS_SECTION = "best_checkpoints"

#: Sections every grammar knows. Custom ones are added by ``declare_prefix``.
BUILTIN_SECTIONS = ("eval", "test", "train", TRAIN_SUBSET_PREFIX, "gap", "early_stopping", SUMMARY_SECTION,
                    BEST_CHECKPOINTS_SECTION)

#: Timing metrics ``Trainer.evaluate``/``predict`` (and ``LightweightTrainer``) add after
#: ``<metric_key_prefix>_``: measurements of the run, not of the model (never a learning curve,
#: never reported for a train subset). The one list of them in the package.
TIMING_NAMES = (
    "runtime",
    "samples_per_second",
    "steps_per_second",
    "tokens_per_second",
    "model_preparation_time",
    "jit_compilation_time",
)
#: The timing suffixes *every* ``evaluate``/``predict`` adds (they reveal its prefix).
SPEED_SUFFIXES = tuple(f"_{name}" for name in TIMING_NAMES[:3])


@dataclass(frozen=True)
class MetricKey:
    """A parsed log key.

    Attributes:
        raw: The key as logged.
        section: ``"train"``, ``"eval"``, ``"test"``, ``"train_subset"``, ``"gap"``,
            ``"early_stopping"``, ``"train_summary"`` or a custom prefix.
        dataset: Eval dataset name for ``eval_<dataset>_<name>`` keys, else None.
        name: The metric name inside its section (``"accuracy"``, ``"loss"``,
            ``"rewards/chosen"``).
        rendered: The tracker name (``"eval/accuracy"``, ``"train_summary/runtime"``).
    """

    raw: str
    section: str
    dataset: Optional[str]
    name: str
    rendered: str

    @property
    def is_summary(self) -> bool:
        """True for end-of-training totals and the kept checkpoints' ranking: a run summary, not a curve."""
        return self.section in (SUMMARY_SECTION, BEST_CHECKPOINTS_SECTION)

    @property
    def is_training_loop(self) -> bool:
        """True for keys the training loop logs bare (``loss``, ``learning_rate``...)."""
        return self.section == "train" and self.raw in TRAINING_LOOP_KEYS

    @property
    def is_running(self) -> bool:
        """True for anything measured on the training batches (section ``train``): the loop's
        keys, trl's running metrics (``mean_token_accuracy``, ``rewards/chosen``) and other
        bare keys. Never a train-subset metric."""
        return self.section == "train"


class KeyGrammar:
    """Parses and renders log keys for one trainer.

    Args:
        eval_datasets: Names of the eval datasets when the trainer evaluates a dict of
            datasets (``eval_dataset={"squad": ..., "news": ...}``). Defaults to ().
        prefixes: Custom ``metric_key_prefix`` values (e.g. ``"val"``). Prefixes are also
            learned from evaluation metrics (every evaluation logs ``<prefix>_runtime``).
            Defaults to ().

    Example:
        >>> grammar = KeyGrammar(eval_datasets=["squad"])
        >>> grammar.render("eval_squad_f1")
        'eval/squad/f1'
    """

    def __init__(self, eval_datasets: Iterable[str] = (), prefixes: Iterable[str] = ()) -> None:
        self._datasets: list[str] = []
        self._sections: list[str] = sorted(BUILTIN_SECTIONS, key=len, reverse=True)
        self._cache: dict[tuple[str, bool], MetricKey] = {}
        # Loggers render on a worker thread while the trainer declares prefixes on its own:
        # declarations replace the lists (never sort in place) and bump the generation under
        # this lock, and a parse result is cached only if no declaration happened meanwhile.
        self._lock = threading.Lock()
        self._generation = 0
        #: The names of the last key set `render_logs` saw: ``(signature, [(is_summary, name)])``.
        self._last_plan: Optional[tuple[Any, list[tuple[bool, str]]]] = None
        self._warned_collisions: set[tuple[str, str]] = set()
        for name in eval_datasets:
            self.declare_dataset(name)
        for prefix in prefixes:
            self.declare_prefix(prefix)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable and deep-copyable (callbacks holding the grammar are): the lock is not copied."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def from_trainer(cls, trainer: Any) -> KeyGrammar:
        """Build the grammar of a trainer: its eval dataset names and known prefixes.

        Args:
            trainer: A ``transformers.Trainer``, ``TrainerPlus`` or ``LightweightTrainer``.
                When ``trainer.eval_dataset`` is a dict its keys are the dataset names.

        Returns:
            A new grammar.
        """
        grammar = cls()
        eval_dataset = getattr(trainer, "eval_dataset", None)
        if isinstance(eval_dataset, Mapping):
            for name in eval_dataset:
                if isinstance(name, str) and name:
                    grammar.declare_dataset(name)
        return grammar

    # -- configuration ---------------------------------------------------------------
    @property
    def eval_datasets(self) -> tuple[str, ...]:
        """The known eval dataset names."""
        return tuple(self._datasets)

    @property
    def sections(self) -> tuple[str, ...]:
        """Known section prefixes (``eval``, ``test``, ``train`` and custom ones)."""
        return tuple(self._sections)

    def declare_dataset(self, name: str) -> None:
        """Register an eval dataset name (keys ``eval_<name>_<metric>``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"declare_dataset: name must be a non-empty string, got {name!r}")
        with self._lock:
            if name not in self._datasets:
                self._datasets = sorted([*self._datasets, name], key=len, reverse=True)  # longest first
                self._reset_cache()

    def declare_prefix(self, prefix: str) -> None:
        """Register a custom section prefix (keys ``<prefix>_<metric>``)."""
        if not isinstance(prefix, str) or not prefix or "/" in prefix:
            raise ValueError(
                f"declare_prefix: prefix must be a non-empty string without '/', got {prefix!r}"
            )
        if prefix.startswith("eval_") and prefix[len("eval_"):]:
            self.declare_dataset(prefix[len("eval_"):])
            return
        if prefix not in self._sections:
            with self._lock:
                if prefix not in self._sections:
                    self._sections = sorted([*self._sections, prefix], key=len, reverse=True)
                    self._reset_cache()

    def _reset_cache(self) -> None:
        """Drop cached parses (caller holds the lock)."""
        self._generation += 1
        self._cache = {}

    def learn_from_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Learn the prefix of an evaluation from its metrics (``<prefix>_runtime``...)."""
        for key in metrics:
            for suffix in SPEED_SUFFIXES:
                if isinstance(key, str) and key.endswith(suffix) and len(key) > len(suffix):
                    prefix = key[: -len(suffix)]
                    if prefix != "train":
                        self.declare_prefix(prefix)

    # -- parsing -----------------------------------------------------------------------
    def parse(self, key: str, *, summary: bool = False) -> MetricKey:
        """Parse one key. Never raises.

        Args:
            key: A raw or already rendered key (any object is turned into ``str``).
            summary: The key comes from the end-of-training record. Defaults to False.

        Returns:
            The parsed key.
        """
        key = key if isinstance(key, str) else str(key)
        cached = self._cache.get((key, summary))
        if cached is None:
            generation = self._generation
            cached = self._parse(key, summary)
            with self._lock:
                if generation == self._generation and len(self._cache) < 100_000:
                    self._cache[(key, summary)] = cached
        return cached

    def _parse(self, key: str, summary: bool) -> MetricKey:
        if (summary and (key.startswith("train_") or key == "epoch")) or key == "total_flos":
            name = key[len("train_"):] if key.startswith("train_") and len(key) > len("train_") else key
            return MetricKey(key, SUMMARY_SECTION, None, name, f"{SUMMARY_SECTION}/{name}")
        if "/" in key and not key.startswith("/"):
            return self._parse_with_slash(key)
        return self._parse_flat(key) or self._bare(key)

    def _bare(self, key: str) -> MetricKey:
        """A key without a known prefix: measured by the training loop (``loss``, trl's keys...)."""
        return MetricKey(key, "train", None, key, f"train/{key}" if key else "train/<empty>")

    def _parse_flat(self, key: str) -> Optional[MetricKey]:
        """``<prefix>_<name>`` keys; None for a bare key."""
        if key in TRAINING_LOOP_KEYS:
            return None
        for dataset in self._datasets:
            head = f"eval_{dataset}_"
            if key.startswith(head) and len(key) > len(head):
                name = key[len(head):]
                return MetricKey(key, "eval", dataset, name, f"eval/{dataset}/{name}")
        for section in self._sections:  # longest first: train_subset_ before train_
            head = f"{section}_"
            if key.startswith(head) and len(key) > len(head):
                name = key[len(head):]
                if section == "train":  # the stock workaround: evaluate(train_ds, metric_key_prefix="train")
                    section = TRAIN_SUBSET_PREFIX
                return MetricKey(key, section, None, name, f"{section}/{name}")
        return None

    def _parse_with_slash(self, key: str) -> MetricKey:
        head, _, rest = key.partition("/")
        if head in self._sections:  # already rendered: section/(dataset/)name
            parts = rest.split("/")
            dataset = None
            if len(parts) > 1 and parts[0] and parts[0] not in METRIC_FAMILIES:
                dataset, parts = parts[0], parts[1:]
            return MetricKey(key, head, dataset, "/".join(parts), key)
        if head in METRIC_FAMILIES:  # trl's running metrics: rewards/chosen, logps/rejected...
            return MetricKey(key, "train", None, key, f"train/{key}")
        prefixed = self._parse_flat(head)  # eval_rewards/chosen, train_subset_logps/chosen...
        if prefixed is not None:
            return MetricKey(key, prefixed.section, prefixed.dataset, f"{prefixed.name}/{rest}",
                             f"{prefixed.rendered}/{rest}")
        parts = key.split("/")  # a user's own rendered key: kept as it is
        dataset = (parts[1] or None) if len(parts) > 2 else None
        return MetricKey(key, head, dataset, parts[-1], key)

    def render(self, key: str, *, summary: bool = False) -> str:
        """Return the tracker name of ``key`` (see `parse`)."""
        return self.parse(key, summary=summary).rendered

    @staticmethod
    def is_summary_record(logs: Mapping[str, Any]) -> bool:
        """True for the end-of-training record of ``Trainer.train``.

        It carries ``train_runtime``, no running ``loss`` (a training record under
        ``include_num_input_tokens_seen`` carries both) and no other ``train_*`` key than the run
        totals (an ``evaluate(..., metric_key_prefix="train")`` record carries its metrics too).
        ``total_flos`` cannot tell: transformers' ``PrinterCallback`` removes it from the record.
        """
        if "train_runtime" not in logs or "loss" in logs:
            return False
        return all(key in SUMMARY_KEYS for key in logs if isinstance(key, str) and key.startswith("train_"))

    def render_logs(self, logs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Render one log record into (curve values, summary values).

        Nested dicts are flattened first. Two keys that would render to the same name keep
        distinct names: the later one falls back to ``<section>/<raw key>`` (a raw key
        holding ``/`` keeps its own name plus ``_``), with one warning per pair naming it.

        Returns:
            ``(curves, summary)``: rendered names to values.
        """
        summary_record = self.is_summary_record(logs)
        flat = flatten_metrics(logs)
        # the names depend only on the keys (and what the grammar knows): a logger renders the
        # same key set at every step, so the last plan is kept and reused while it matches
        signature = (self._generation, summary_record, tuple(flat))
        last = self._last_plan  # read once: loggers on other threads may share this grammar
        if last is None or last[0] != signature:
            plan = []
            origin: dict[str, str] = {}
            for raw in flat:
                parsed = self.parse(raw, summary=summary_record)
                name = parsed.rendered
                if name in origin and origin[name] != raw:
                    name = self._disambiguate(parsed, origin)
                origin[name] = raw
                plan.append((parsed.is_summary, name))
            last = self._last_plan = (signature, plan)
        curves: dict[str, Any] = {}
        summary: dict[str, Any] = {}
        for (is_summary, name), value in zip(last[1], flat.values()):
            (summary if is_summary else curves)[name] = value
        return curves, summary

    def _disambiguate(self, parsed: MetricKey, origin: Mapping[str, str]) -> str:
        if "/" in parsed.raw or parsed.is_summary:
            candidate = parsed.raw  # never section/section/...: a rendered name gets a "_"
        else:
            candidate = f"{parsed.section}/{parsed.raw}"
        while candidate in origin:
            candidate += "_"
        pair = (origin[parsed.rendered], parsed.raw)
        if pair not in self._warned_collisions:
            self._warned_collisions.add(pair)
            logger.warning(
                "Log keys %r and %r both render to %r; logging %r as %r.",
                pair[0], pair[1], parsed.rendered, parsed.raw, candidate,
            )
        return candidate

    # -- lookup ------------------------------------------------------------------------
    def candidates(self, monitor: str) -> list[str]:
        """Raw keys ``monitor`` may refer to, most specific first.

        ``"accuracy"`` may be ``eval_accuracy`` (transformers' ``metric_for_best_model``
        convention) or a bare key; ``"eval/accuracy"`` is matched through rendering.
        """
        out = [monitor]
        if not self.has_section(monitor):
            out.insert(0, f"eval_{monitor}")
        return out

    def canonical(self, monitor: str) -> str:
        """The raw key a monitor name stands for: one spelling per metric.

        A rendered name becomes the raw key it renders from (``"eval/loss"`` -> ``"eval_loss"``,
        ``"eval/squad/f1"`` -> ``"eval_squad_f1"``, ``"train_subset/accuracy"`` ->
        ``"train_subset_accuracy"``, ``"train/loss"`` -> ``"loss"``); any other name is returned
        as it is (a bare ``"accuracy"`` stays bare: it is resolved when the metrics arrive).

        Example:
            >>> KeyGrammar().canonical("eval/loss"), KeyGrammar().canonical("eval_loss")
            ('eval_loss', 'eval_loss')
        """
        head, slash, rest = monitor.partition("/")
        if not slash or not rest or head not in self._sections or head in ("early_stopping", SUMMARY_SECTION,
                                                                             BEST_CHECKPOINTS_SECTION):
            return monitor
        if head == "train":  # the training loop's bare keys render to train/<key>
            return rest
        parts = rest.split("/")
        if head == "eval" and len(parts) > 1 and parts[0] and parts[0] not in METRIC_FAMILIES:
            return f"eval_{parts[0]}_{'/'.join(parts[1:])}"
        return f"{head}_{rest}"

    def has_section(self, key: str) -> bool:
        """``key`` names its section (``eval_loss``, ``train/accuracy``, ``loss``); a bare metric name
        (``accuracy``) does not."""
        if key in TRAINING_LOOP_KEYS:
            return True
        head = key.split("/", 1)[0]
        if "/" in key and head not in METRIC_FAMILIES:
            return True  # rendered (``eval/accuracy``) or a user's own ``a/b`` key
        return any(head.startswith(f"{section}_") for section in self._sections)

    def resolve(self, monitor: str, available: Iterable[str]) -> Optional[str]:
        """Find the raw key in ``available`` that ``monitor`` names, or None.

        Args:
            monitor: A raw key (``eval_loss``), a bare metric name (``accuracy`` means
                ``eval_accuracy`` when present) or a rendered name (``eval/accuracy``).
            available: Keys of a metrics or logs dict.
        """
        keys = [key for key in available if isinstance(key, str)]
        present = set(keys)
        for candidate in self.candidates(monitor):
            if candidate in present:
                return candidate
        for key in keys:
            if self.render(key) == monitor:
                return key
        return None

    def explain_missing(self, monitor: str, available: Iterable[str]) -> str:
        """A message saying ``monitor`` is missing, listing keys and a "did you mean"."""
        keys = sorted({key for key in available if isinstance(key, str)})
        timing = self.parse(monitor).name in TIMING_NAMES  # else timings are never what was meant
        names = [k for k in keys if timing or self.parse(k).name not in TIMING_NAMES]
        suggestions = did_you_mean(monitor, names + [self.render(k) for k in names])
        hint = f" Did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
        return f"Metric {monitor!r} was not found. Available keys: {keys}.{hint}"


def _evaluation_key(key: Any) -> bool:
    return isinstance(key, str) and (key.startswith("eval_") or (
        key.endswith("_runtime") and len(key) > len("_runtime") and key != "train_runtime"))


def is_training_record(logs: Mapping[str, Any]) -> bool:
    """True for a record of the training loop: the running ``loss``, no evaluation's key (under
    ``include_num_input_tokens_seen`` it carries ``train_runtime`` too)."""
    return "loss" in logs and not any(_evaluation_key(key) for key in logs)


def evaluation_prefix(logs: Mapping[str, Any]) -> Optional[str]:
    """The ``metric_key_prefix`` of an evaluation record (from its ``<prefix>_runtime``), or None for
    a training record and the end-of-training record."""
    if is_training_record(logs) or KeyGrammar.is_summary_record(logs):
        return None
    runtimes = (key for key in logs if isinstance(key, str) and key.endswith("_runtime")
                and len(key) > len("_runtime"))
    return next((key[: -len("_runtime")] for key in runtimes), None)


def grammar_for(trainer: Any) -> KeyGrammar:
    """Return ``trainer.key_grammar``, creating (and attaching) it when missing.

    ``TrainerPlus`` keeps one grammar per trainer and feeds it the prefixes passed to
    ``evaluate``; for any other trainer this builds one with `KeyGrammar.from_trainer`
    and stores it on the trainer, so every callback of that trainer shares it.

    Args:
        trainer: Any trainer object (``None`` gives a fresh default grammar).

    Returns:
        The trainer's grammar.
    """
    if trainer is None:
        return KeyGrammar()
    grammar = getattr(trainer, "key_grammar", None)
    if isinstance(grammar, KeyGrammar):
        return grammar
    grammar = KeyGrammar.from_trainer(trainer)
    try:
        trainer.key_grammar = grammar
    except AttributeError:  # a trainer with __slots__ or a read-only attribute
        pass
    return grammar
