"""Every example in examples/ runs (tiny sizes via EXAMPLES_TINY=1) and shows what it claims."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.examples.conftest import EXAMPLES, ROOT, run_example

HERE = Path(__file__).resolve().parent


def tiny(monkeypatch):
    monkeypatch.setenv("EXAMPLES_TINY", "1")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.transformers
@pytest.mark.mlflow
def test_stock_trainer_example(tmp_path, monkeypatch):
    tiny(monkeypatch)
    out = run_example(tmp_path, "stock_trainer.py", str(tmp_path)).stdout
    evals = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(evals) >= 2 and all("train_subset_accuracy" in line for line in evals)
    assert re.search(r"best eval_accuracy [0-9.]+ at step \d+", out)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    curves = {key for rec in records if rec["event"] == "log" for key in rec["curves"]}
    assert {"eval/accuracy", "train_subset/accuracy", "gap/loss", "early_stopping/best_value"} <= curves

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("stock").experiment_id])
    assert run.info.status == "FINISHED" and "train_subset/accuracy" in run.data.metrics


@pytest.mark.transformers
def test_trainer_plus_example(tmp_path, monkeypatch):
    tiny(monkeypatch)
    out = run_example(tmp_path, "trainer_plus.py", str(tmp_path)).stdout
    for name in ("LabelSmoothingTrainer", "WeightedLossTrainerPlus"):
        expected = rf"{name}: \d+ evaluations logged; .* eval/error_rate [0-9.]+, train_subset/accuracy"
        assert re.search(expected, out)
        records = [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["event"] == "log"]
        evals = [r["curves"] for r in records if "eval/loss" in r["curves"]]
        assert evals and all("eval/error_rate" in c and "train_subset/accuracy" in c for c in evals)
        assert all(abs(c["eval/error_rate"] - (1 - c["eval/accuracy"])) < 1e-9 for c in evals)


def test_custom_callback_example_passes_without_transformers_or_torch(tmp_path):
    # The example's pytest file runs with torch/transformers/accelerate/datasets unimportable.
    run_example(tmp_path, "test_custom_callback_example.py", "-q", "-p", "no:cacheprovider",
                "--rootdir", str(ROOT), command=[sys.executable, str(HERE / "block_heavy_imports.py")])


def test_custom_callback_example_fails_when_the_callback_is_broken(tmp_path):
    # the example's tests can fail: break the callback (never stops) and they must
    broken = tmp_path / "test_broken_example.py"
    source = (EXAMPLES / "test_custom_callback_example.py").read_text()
    broken.write_text(source.replace("control.should_training_stop = True", "pass"))
    import subprocess

    result = subprocess.run([sys.executable, "-m", "pytest", str(broken), "-q", "-p", "no:cacheprovider",
                             "--rootdir", str(tmp_path)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 1 and "2 failed" in result.stdout, result.stdout


def test_lightweight_loop_example(tmp_path):
    out = run_example(tmp_path, "lightweight_loop.py", str(tmp_path)).stdout
    assert out.count("optimizer steps") == 2  # StepTimer: two epochs of 10 steps each
    assert "'model/w'" in out  # AddWeights edited the record through on_pre_log
    assert "[StopWhenGoodEnough] eval_mae=" in out and "trained 20 steps" in out
    w, b = (float(part.split("=")[1]) for part in out.split("model: ")[1].split("(")[0].split())
    assert abs(w - 2) < 0.2 and abs(b - 3) < 0.2  # the fit converged


@pytest.mark.transformers
@pytest.mark.mlflow
@pytest.mark.wandb
def test_resume_example_same_stop_step_same_tracker_runs(tmp_path, monkeypatch):
    tiny(monkeypatch)
    # min_delta=10: evaluations after the first never improve; patience 2 stops at the 3rd
    # evaluation (step 9). Interrupted after step 6 (wait=1): only a restored counter stops at 9.
    out = run_example(tmp_path, "resume.py", str(tmp_path), "--interrupt-at", "6", "--patience", "2",
                      "--min-delta", "10", "--compare").stdout
    lines = {line.split(":")[0]: line for line in out.splitlines() if line.startswith(("phase", "uninterr"))}
    assert "global_step 6, early stopping did not stop" in lines["phase 1"]
    assert "global_step 9, early stopping stopped at step 9" in lines["phase 2 (resumed)"]
    assert "stopped at step 9 (best eval_loss" in lines["uninterrupted"]
    ids = [re.search(r"MLflow run (\w+), W&B run (\w+)", lines[key]).groups()
           for key in ("phase 1", "phase 2 (resumed)")]
    assert ids[0] == ids[1]  # the same MLflow run and the same W&B run continued

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("resume-run").experiment_id])
    assert [r.info.run_id for r in runs] == [ids[0][0]] and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(ids[0][0], "eval/loss")] == [3, 6, 9]
    assert [m.step for m in client.get_metric_history(ids[0][0], "train/loss")] == [3, 6, 9]
    steps = [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")
             if r["event"] == "log" and "eval/loss" in r["curves"]]
    assert steps == [3, 6, 9]


@pytest.mark.transformers
@pytest.mark.mlflow
@pytest.mark.wandb
@pytest.mark.slow
def test_trl_sft_lora_example(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    tiny(monkeypatch)
    out = run_example(tmp_path, "trl_sft_lora.py", str(tmp_path)).stdout
    assert "LoRA: 896 trainable parameters of 27232" in out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if ": train subset" in line}
    assert set(lines) == {"loss", "mean_token_accuracy", "entropy"}  # SFT's own metrics, with gaps
    best = re.search(r"best eval_loss ([\d.]+) at step (\d+)", out)
    restored = re.search(r"eval_loss after restoring the best adapter: ([\d.]+)", out)
    assert best and restored and restored.group(1) == best.group(1)

    curves = [r["curves"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "log"
              and "eval/loss" in r["curves"]]
    assert len(curves) == 4
    for name in ("train_subset/loss", "train_subset/mean_token_accuracy", "train_subset/entropy",
                 "gap/mean_token_accuracy", "eval/mean_token_accuracy"):
        assert all(name in c for c in curves), name
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("trl-sft-lora").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id,
                                                      "train_subset/mean_token_accuracy")] == [4, 8, 12, 16]
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1


@pytest.mark.transformers
def test_streaming_metrics_example(tmp_path, monkeypatch):
    pytest.importorskip("torchmetrics")
    tiny(monkeypatch)
    out = run_example(tmp_path, "streaming_metrics.py", str(tmp_path)).stdout
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    pattern = (r"step +\d+: accuracy training [0-9.]+  train subset [0-9.]+  eval [0-9.]+  "
               r"eval f1_macro [0-9.]+")
    assert len(lines) >= 2 and all(re.fullmatch(pattern, line) for line in lines)
    assert re.search(r"\d+ predictions files; (eval|train_subset)-step-\d+\.jsonl: \d+ rows", out)
    evals = sorted((tmp_path / "predictions").glob("eval-step-*.jsonl"))
    assert evals and all(1 <= len(path.read_text().splitlines()) <= 100 for path in evals)
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    curves = [r["curves"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "log"]
    assert any("train/accuracy" in c for c in curves) and any("eval/f1_macro" in c for c in curves)
    assert any("train_subset/accuracy" in c for c in curves)
