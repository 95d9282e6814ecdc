"""StreamingMetrics under ``torchrun --nproc_per_node 2`` (CPU, gloo): evaluation metrics equal the
single-process reference over the whole eval set (the uneven last batch counted once), training
metrics cover both ranks' micro-batches of each window, the same on every rank; predictions
written once, by rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.callbacks.test_early_stopping_distributed import free_port
from tests.streaming_reference import assert_same_metrics, reference_values
from tests.tiny_models import TinyClassifier, classification_rows

pytestmark = [pytest.mark.transformers, pytest.mark.distributed, pytest.mark.slow]
pytest.importorskip("torchmetrics")
REPO = Path(__file__).resolve().parents[2]


def test_two_ranks_count_every_example_once(tmp_path):
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
    outcomes = [json.loads((tmp_path / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]

    def same_on_every_rank(record):  # timings, and the Trainer's own per-rank train_loss, differ
        return {
            k: v
            for k, v in record.items()
            if not any(t in k for t in ("runtime", "per_second", "train_loss"))
        }

    assert [same_on_every_rank(r) for r in outcomes[0]["log_history"]] == [
        same_on_every_rank(r) for r in outcomes[1]["log_history"]
    ]

    # training: each logged window holds both ranks' micro-batches (2 steps x 2 ranks x 4 rows)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 2
    for index, record in enumerate(records):
        batches = [b for outcome in outcomes for b in outcome["recorded"][2 * index : 2 * index + 2]]
        expected = reference_values(
            np.concatenate([np.array(b[0]) for b in batches]),
            np.concatenate([np.array(b[1]) for b in batches]),
            "classification",
            3,
        )
        assert sum(v for k, v in record.items() if k.startswith("confusion_")) == 16
        assert_same_metrics(record, expected, prefix="")

    # evaluation: the 30 rows once each (the last gathered batch holds 6, not 8)
    model = TinyClassifier()
    model.load_state_dict(torch.load(tmp_path / "final.pt"))
    rows = classification_rows(30, seed=2)
    with torch.no_grad():  # in the ranks' batches of 4 rows, so the logits are bit for bit theirs
        logits = np.concatenate(
            [
                model(torch.stack([r["features"] for r in rows[i : i + 4]]))["logits"].numpy()
                for i in range(0, 30, 4)
            ]
        )
    labels = np.array([int(r["labels"]) for r in rows])
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
