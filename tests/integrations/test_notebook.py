"""In a Jupyter notebook, transformers' table shows the trainer's own columns unchanged and our
values beside them. A notebook is executed in a real kernel (nbclient,
ipykernel): a stock ``Trainer`` without our callbacks, then ``TrainerPlus`` and a stock ``Trainer``
with ``run_before_integrations``, both with ``TrainSubsetEvaluation(gap_metrics=True)`` and
``EarlyStopping``. The test reads each cell's output as the user sees it: the HTML table
``NotebookProgressCallback`` drew last, and the printed log records and ``evaluate()`` results."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

# one kernel run for the module: both tests on one pytest-xdist worker (--dist loadgroup)
pytestmark = [pytest.mark.transformers, pytest.mark.xdist_group("notebook")]
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[2]

SETUP = """
import json, sys, warnings
sys.path.insert(0, {repo!r})
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
from hf_callbacks_plus import ConsoleSummary, EarlyStopping, TrainSubsetEvaluation, TrainerPlus
from hf_callbacks_plus.integrations.ordering import run_before_integrations
from tests.tiny_models import make_trainer

ARGS = dict(max_steps=8, eval_strategy="steps", eval_steps=4, logging_steps=4, disable_tqdm=False)

def ours():
    return [TrainSubsetEvaluation(size=16, gap_metrics=True), EarlyStopping("eval_loss", patience=5)]

def show(name, trainer):
    trainer.train()  # transformers draws its progress bar and table in this cell's output
    print("HISTORY " + json.dumps([r for r in trainer.state.log_history if "eval_loss" in r]))
"""

CELLS = {
    "stock": 'stock = make_trainer({out!r} + "/stock", **ARGS)\nshow("stock", stock)',
    "plus": 'plus = make_trainer({out!r} + "/plus", callbacks=ours(), trainer_class=TrainerPlus, **ARGS)\n'
            'show("plus", plus)',
    "wired": 'wired = make_trainer({out!r} + "/wired", **ARGS)\nrun_before_integrations(wired, *ours())\n'
             'show("wired", wired)',
    "evaluate": 'print("EVALUATE " + json.dumps({{name: trainer.evaluate() for name, trainer in '
                '[("stock", stock), ("plus", plus), ("wired", wired)]}}))',
    "summary": 'summary = make_trainer({out!r} + "/summary", callbacks=[*ours(), ConsoleSummary()], '
               'trainer_class=TrainerPlus, **ARGS)\nshow("summary", summary)',
}


class TableReader(HTMLParser):
    """The rows (header first) of the HTML tables transformers draws (``text_to_html_table``)."""

    def __init__(self):
        super().__init__()
        self.rows, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("th", "td"):
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("th", "td"):
            self.rows[-1].append(self._cell.strip())
            self._cell = None


def shown(value) -> str:
    """A value as transformers writes it in the table."""
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def run_notebook(output_dir: Path) -> dict[str, dict]:
    """Execute the notebook; per cell: the training table as displayed last, and the printed JSON."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(SETUP.format(repo=str(REPO)))]
    notebook.cells += [nbformat.v4.new_code_cell(cell.format(out=str(output_dir))) for cell in CELLS.values()]
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    results: dict[str, dict] = {}
    for name, cell in zip(CELLS, notebook.cells[1:]):
        result: dict = {}
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            if "<progress" in html and "<table" in html:  # the training bar and its table
                reader = TableReader()
                reader.feed(html)
                result["table"] = reader.rows
            for line in output.get("text", "").splitlines():
                head, _, payload = line.partition(" ")
                if head in ("HISTORY", "EVALUATE"):
                    result[head.lower()] = json.loads(payload)
                elif output.get("name") == "stdout" and line.startswith("step "):
                    result.setdefault("lines", []).append(line)
        results[name] = result
    return results


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> dict[str, dict]:
    """The notebook, executed once for the module's tests."""
    return run_notebook(tmp_path_factory.mktemp("notebook"))


def test_the_notebook_table_shows_the_trainers_columns_and_ours_beside_them(notebook):
    results = notebook
    stock_header, *stock_rows = results["stock"]["table"]
    assert stock_header == ["Step", "Training Loss", "Validation Loss", "Mse", "Mae"]
    assert [row[0] for row in stock_rows] == ["4", "8"]
    evaluated = results["evaluate"]["evaluate"]
    for name in ("plus", "wired"):
        header, *rows = results[name]["table"]
        width = len(stock_header)
        assert header[:width] == stock_header, name  # the trainer's own columns, unchanged
        assert [row[:width] for row in rows] == stock_rows, name  # and their values (training untouched)
        assert {"Train Subset Loss", "Train Subset Mse", "Gap Loss", "Gap Mse", "Early Stopping Wait",
                "Early Stopping Best Value"} <= set(header[width:]), (name, header)
        for row, record in zip(rows, results[name]["history"]):  # each cell holds the record's value
            cells = dict(zip(header, row))
            assert cells["Validation Loss"] == shown(record["eval_loss"])
            assert cells["Gap Loss"] == shown(record["gap_loss"])
            assert cells["Train Subset Mse"] == shown(record["train_subset_mse"])
            assert cells["Early Stopping Wait"] == shown(record["early_stopping/wait"])
        # evaluate() returns what a stock Trainer returns in a notebook (transformers' table
        # removes the timings from it), plus our keys
        extra = set(evaluated[name]) - set(evaluated["stock"])
        assert set(evaluated["stock"]) <= set(evaluated[name]), name
        assert extra and all(key.startswith(("train_subset_", "gap_")) for key in extra), (name, extra)


def test_with_console_summary_the_row_is_its_line(notebook):
    """``ConsoleSummary`` in a notebook: nothing printed, the table's row holds the line's values
    (the monitored loss, its train-subset value and gap, the best so far) and no other column."""
    results = notebook
    header, *rows = results["summary"]["table"]
    assert header == ["Step", "Training Loss", "Validation Loss", "Train Subset Loss", "Gap Loss",
                      "Best Loss", "Best Step"]
    assert "lines" not in results["summary"]  # the row says it: no line printed under the table
    best = None
    for row, record in zip(rows, results["summary"]["history"]):
        cells = dict(zip(header, row))
        if best is None or record["eval_loss"] < best[0]:
            best = (record["eval_loss"], record["step"])
        assert cells["Validation Loss"] == shown(record["eval_loss"])
        assert cells["Train Subset Loss"] == shown(record["train_subset_loss"])
        assert cells["Gap Loss"] == shown(record["gap_loss"])
        assert (cells["Best Loss"], cells["Best Step"]) == (shown(best[0]), shown(best[1]))
