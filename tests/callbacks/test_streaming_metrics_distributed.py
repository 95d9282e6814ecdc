"""StreamingMetrics under ``torchrun --nproc_per_node 2`` (CPU, gloo), one launch for two scenarios
(tests/callbacks/streaming_ddp_script.py): evaluation metrics equal the single-process reference
over the whole eval set (the uneven last batch counted once), training metrics cover both ranks'
micro-batches of each window, the same on every rank; predictions written once, by rank 0. With
the default metrics (sum states) and with the docs' MulticlassAUROC (list states) beside a
metric with max and min states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from tests.callbacks.test_early_stopping_distributed import free_port
from tests.streaming_reference import assert_same_metrics, reference_values
from tests.tiny_models import TinyClassifier, classification_rows

pytestmark = [pytest.mark.transformers, pytest.mark.distributed, pytest.mark.slow]
pytest.importorskip("torchmetrics")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The output folder of one torchrun launch of the script (both scenarios)."""
    tmp_path = tmp_path_factory.mktemp("streaming_ddp")
    torchrun = Path(sys.executable).with_name("torchrun")
    script = Path(__file__).with_name("streaming_ddp_script.py")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(script),
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path


def outcomes_of(folder):
    """Both ranks' outcomes; their log histories agree (but timings and per-rank train_loss)."""
    outcomes = [json.loads((folder / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]

    def same_on_every_rank(record):
        return {
            k: v
            for k, v in record.items()
            if not any(t in k for t in ("runtime", "per_second", "train_loss"))
        }

    assert [same_on_every_rank(r) for r in outcomes[0]["log_history"]] == [
        same_on_every_rank(r) for r in outcomes[1]["log_history"]
    ]
    return outcomes


def eval_logits(folder):
    """The final model's logits of the 30 eval rows, in the ranks' batches of 4 rows (so bit for
    bit theirs), and the labels."""
    model = TinyClassifier()
    model.load_state_dict(torch.load(folder / "final.pt"))
    rows = classification_rows(30, seed=2)
    with torch.no_grad():
        logits = np.concatenate(
            [
                model(torch.stack([r["features"] for r in rows[i : i + 4]]))["logits"].numpy()
                for i in range(0, 30, 4)
            ]
        )
    return logits, np.array([int(r["labels"]) for r in rows])


def window(outcomes, index):
    """The training forward passes of logging window ``index`` (2 steps) on both ranks."""
    batches = [b for outcome in outcomes for b in outcome["recorded"][2 * index : 2 * index + 2]]
    logits = np.concatenate([np.array(b[0]) for b in batches])
    return logits, np.concatenate([np.array(b[1]) for b in batches])


def test_two_ranks_count_every_example_once(launched):
    tmp_path = launched
    outcomes = outcomes_of(tmp_path)

    # training: each logged window holds both ranks' micro-batches (2 steps x 2 ranks x 4 rows)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 2
    for index, record in enumerate(records):
        expected = reference_values(*window(outcomes, index), "classification", 3)
        assert sum(v for k, v in record.items() if k.startswith("confusion_")) == 16
        assert_same_metrics(record, expected, prefix="")

    # evaluation: the 30 rows once each (the last gathered batch holds 6, not 8)
    logits, labels = eval_logits(tmp_path)
    evaluation = next(r for r in outcomes[0]["log_history"] if "eval_accuracy" in r)
    assert sum(v for k, v in evaluation.items() if k.startswith("eval_confusion_")) == 30
    expected = reference_values(logits, labels, "classification", 3)
    assert_same_metrics(evaluation, expected)

    files = sorted((tmp_path / "predictions").iterdir())
    assert [f.name for f in files] == ["eval-step-5.jsonl"]
    predictions = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [p["id"] for p in predictions] == list(range(30))
    assert [p["label"] for p in predictions] == labels.tolist()
    assert [p["prediction"] for p in predictions] == logits.argmax(-1).tolist()


def softmax(logits):
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def list_state_reference(logits, labels):
    """scikit-learn's one-vs-rest macro AUROC (MulticlassAUROC's definition) and numpy's max/min."""
    auroc = roc_auc_score(labels, softmax(logits.astype(np.float64)), multi_class="ovr", average="macro")
    return {"auroc": auroc, "max_score": float(logits.max()), "min_score": float(logits.min())}


def test_list_max_and_min_states_under_two_ranks(launched):
    """The docs' MulticlassAUROC (list states) and a metric with max and min states: evaluation
    over the 30 rows and each training window over both ranks' micro-batches equal scikit-learn
    and numpy (before: only rank 0 updated, and the gather of lists of different lengths aborted
    both ranks)."""
    folder = launched / "list_states"
    outcomes = outcomes_of(folder)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 2
    for index, record in enumerate(records):
        expected = list_state_reference(*window(outcomes, index))
        for name, value in expected.items():
            assert record[name] == pytest.approx(value, rel=1e-6, abs=1e-6), (index, name)
    evaluation = next(r for r in outcomes[0]["log_history"] if "eval_auroc" in r)
    for name, value in list_state_reference(*eval_logits(folder)).items():
        assert evaluation[f"eval_{name}"] == pytest.approx(value, rel=1e-6, abs=1e-6), name
