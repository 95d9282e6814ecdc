"""The console lines the docs show are what the code prints for them (issue 41).

Each ``text`` block of README.md, docs/quickstart.md and docs/console.md that holds console lines
is replayed: its numbers become the log records and evaluations they came from, fed through a
real `LightweightTrainer`'s ``log()`` to the `ConsoleSummary` and `EarlyStopping` built as the
page's own code builds them (docs/console.md shows `make demo`: the demo's callbacks). Every line
of the block must be printed, character for character: a page whose ``ConsoleSummary()`` prints
less than its block shows, or a change of the line's format, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from hf_callbacks_plus import ConsoleSummary, EarlyStopping, LightweightTrainer, LoopArguments
from tests.examples.conftest import load_example

ROOT = Path(__file__).resolve().parents[1]

HEAD = re.compile(r"step (?P<step>\d+)/(?P<max_steps>\d+) \(epoch (?P<epoch>[\d.]+)\)")
METRIC = re.compile(
    r"(?P<key>\w+) (?P<value>\S+)(?: \(subset (?P<subset>\S+), gap (?P<gap>\S+)\))?"
    r"(?: best (?P<best>\S+) @ (?P<best_step>\d+)(?: (?P<new>new)| wait (?P<wait>\d+)/\d+)?)?"
)
THROUGHPUT = re.compile(r"(?P<sequences>\S+) sequences/s, (?P<tokens>\S+) tokens/s")
STOP = re.compile(r"EarlyStopping stopped training at step (?P<step>\d+): (?P<key>\w+)=(?P<value>\S+) "
                  r"did not improve on the best (?P<best>\S+) at step (?P<best_step>\d+) .*")
SHORT_NAMES = {"lr": "learning_rate"}


def number(text: str) -> float:
    """``0.539``, ``+0.13``, ``1.67k`` as the line prints them."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1], 1.0)
    return float(text[:-1] if scale != 1.0 else text) * scale


def console_blocks(page: Path) -> list[list[str]]:
    """The ``text`` blocks of ``page`` that hold console lines (``step N/M ...``)."""
    blocks = re.findall(r"```text\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    return [block.splitlines() for block in blocks if re.search(r"^step \d+", block, re.M)]


def callbacks_of_page(page: Path) -> tuple[ConsoleSummary, EarlyStopping, set[str]]:
    """The ``ConsoleSummary(...)`` and ``EarlyStopping(...)`` of the page's python block that builds
    one, and the names of every class that block calls."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    code = next(block for block in blocks if "ConsoleSummary(" in block)
    classes = {"ConsoleSummary": ConsoleSummary, "EarlyStopping": EarlyStopping}
    built, called = {}, set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called.add(node.func.id)
            if node.func.id in classes:
                built[node.func.id] = eval(compile(ast.Expression(body=node), str(page), "eval"), classes)
    return built["ConsoleSummary"], built["EarlyStopping"], called


def callbacks_of_the_demo() -> tuple[ConsoleSummary, EarlyStopping, set[str]]:
    """`make demo`'s, with its default options."""
    demo = load_example("demo")
    callbacks = demo.monitoring_callbacks(demo.parse_args([]))
    return callbacks["console"], callbacks["early_stopping"], {type(c).__name__ for c in callbacks.values()}


class Replay:
    """A LightweightTrainer whose records are given, not trained: ``log()`` fires on_pre_log (the
    stopper observes) and on_log (the summary prints), as after a real step or evaluation."""

    def __init__(self, tmp_path: Path, summary: ConsoleSummary, stopper: EarlyStopping) -> None:
        args = LoopArguments(output_dir=str(tmp_path), eval_strategy="steps", eval_steps=1, logging_steps=1,
                             disable_tqdm=True)
        self.trainer = LightweightTrainer(args, train_step=lambda batch: 0.0, train_data=[[0]],
                                          eval_fn=lambda trainer: {}, callbacks=[stopper, summary])
        self.stopper = stopper
        state = self.trainer.state
        self.trainer.callback_handler.on_train_begin(args, state, self.trainer.control)

    def log(self, step: int, max_steps: int, epoch: float, record: dict[str, float]) -> None:
        state = self.trainer.state
        state.global_step, state.max_steps, state.epoch = step, max_steps, epoch
        self.trainer.log(dict(record))

    def evaluation(self, step: int, max_steps: int, epoch: float, metrics: dict[str, float],
                   throughput: dict[str, float]) -> None:
        """One evaluation: the training record of its step (its throughput), then its own."""
        if throughput:
            self.log(step, max_steps, epoch, {"loss": 1.0, **throughput})
        self.log(step, max_steps, epoch, {**metrics, "eval_runtime": 1.0})


def parse(line: str, called: set[str]) -> dict[str, Any]:
    """The record of a console line: the train-subset values and gaps only with a
    ``TrainSubsetEvaluation``, the throughput only with a ``ThroughputMonitor`` among ``called``."""
    head, *parts = line.split(" | ")
    found = HEAD.fullmatch(head)
    assert found, f"not a console line: {line!r}"
    parsed: dict[str, Any] = {"step": int(found["step"]), "max_steps": int(found["max_steps"]),
                              "epoch": float(found["epoch"]), "metrics": {}, "throughput": {}, "lead": None}
    for part in parts:
        rate = THROUGHPUT.fullmatch(part)
        if rate:
            if "ThroughputMonitor" in called:
                parsed["throughput"] = {"throughput/sequences_per_second": number(rate["sequences"]),
                                        "throughput/tokens_per_second": number(rate["tokens"])}
            continue
        metric = METRIC.fullmatch(part)
        assert metric, f"unknown part {part!r} of {line!r}"
        key = SHORT_NAMES.get(metric["key"], metric["key"])
        parsed["metrics"][key] = number(metric["value"])
        if metric["subset"] is not None and "TrainSubsetEvaluation" in called:
            name = key.removeprefix("eval_")
            parsed["metrics"][f"train_subset_{name}"] = number(metric["subset"])
            parsed["metrics"][f"gap_{name}"] = number(metric["gap"])
        if metric["best"] is not None:
            parsed["lead"] = (key, number(metric["best"]), int(metric["best_step"]),
                              metric["new"] is not None, int(metric["wait"] or 0))
    return parsed


def replay(block: list[str], callbacks: tuple[ConsoleSummary, EarlyStopping, set[str]],
           tmp_path: Path) -> None:
    """Feed the block's records (and the evaluations its bests and waits imply) in order."""
    summary, stopper, called = callbacks
    run = Replay(tmp_path, summary, stopper)
    stop = next((STOP.fullmatch(line) for line in block if STOP.fullmatch(line)), None)
    precise = {}  # the stop message's six digits, of which the line shows four
    if stop is not None:
        precise = {(stop["key"], int(stop["step"])): float(stop["value"]),
                   (stop["key"], int(stop["best_step"])): float(stop["best"])}
    for line in block:
        if not HEAD.match(line):
            continue
        parsed = parse(line, called)
        step, metrics = parsed["step"], parsed["metrics"]
        if parsed["lead"] is None:  # a training record
            run.log(step, parsed["max_steps"], parsed["epoch"], {**metrics, **parsed["throughput"]})
            continue
        key, best, best_step, new, wait = parsed["lead"]
        metrics[key] = precise.get((key, step), metrics[key])
        best = precise.get((key, best_step), best)
        if not new:
            if stopper.best_step != best_step:  # the evaluation of the best, before this block
                run.evaluation(best_step, parsed["max_steps"], parsed["epoch"], {key: best}, {})
            for extra in range(wait - 1 - stopper.wait):  # evaluations without improvement between
                run.evaluation(best_step + 1 + extra, parsed["max_steps"], parsed["epoch"],
                               {key: metrics[key]}, {})
        run.evaluation(step, parsed["max_steps"], parsed["epoch"], metrics, parsed["throughput"])


PAGES = {
    "README.md": lambda: callbacks_of_page(ROOT / "README.md"),
    "docs/quickstart.md": lambda: callbacks_of_page(ROOT / "docs" / "quickstart.md"),
    "docs/console.md": callbacks_of_the_demo,
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_console_lines_of_a_page_are_what_its_callbacks_print(page, tmp_path, capsys):
    blocks = console_blocks(ROOT / page)
    assert blocks, f"{page} shows no console line any more: update PAGES"
    for index, block in enumerate(blocks):
        replay(block, PAGES[page](), tmp_path / str(index))
        captured = capsys.readouterr()
        printed = set((captured.out + captured.err).splitlines())
        shown = [line for line in block if HEAD.match(line) or STOP.fullmatch(line)]
        missing = [line for line in shown if line not in printed]
        assert not missing, (f"{page}: these lines are not what the code prints:\n" + "\n".join(missing)
                             + "\n\nit prints:\n" + "\n".join(sorted(printed)))
