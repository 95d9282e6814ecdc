"""Every example in examples/ runs (tiny sizes via EXAMPLES_TINY=1) and shows what it claims.

Each runs through its ``main(argv)`` in this process; one test runs an example as a command.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tests.examples.conftest import EXAMPLES, ROOT, load_example, run_command, run_main

HERE = Path(__file__).resolve().parent
#: The scripts with a command line (demo_pipeline is their shared library; the pytest file is run by pytest).
SCRIPTS = sorted(path.stem for path in EXAMPLES.glob("*.py")
                 if path.stem not in ("demo_pipeline",) and not path.stem.startswith("test_"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.transformers
@pytest.mark.mlflow
def test_stock_trainer_example(tmp_path, monkeypatch, capsys):
    _, out = run_main("stock_trainer", [str(tmp_path)], tmp_path, monkeypatch, capsys)
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
def test_trainer_plus_example(tmp_path, monkeypatch, capsys):
    _, out = run_main("trainer_plus", [str(tmp_path)], tmp_path, monkeypatch, capsys)
    for name in ("LabelSmoothingTrainer", "WeightedLossTrainerPlus"):
        expected = rf"{name}: \d+ evaluations logged; .* eval/error_rate [0-9.]+, train_subset/accuracy"
        assert re.search(expected, out)
        records = [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["event"] == "log"]
        evals = [r["curves"] for r in records if "eval/loss" in r["curves"]]
        assert evals and all("eval/error_rate" in c and "train_subset/accuracy" in c for c in evals)
        assert all(abs(c["eval/error_rate"] - (1 - c["eval/accuracy"])) < 1e-9 for c in evals)


def test_custom_callback_example_passes_without_transformers_or_torch(tmp_path):
    # The example's pytest file runs with torch/transformers/accelerate/datasets unimportable
    # (a new interpreter: here they are imported already).
    command = [sys.executable, str(HERE / "block_heavy_imports.py"), "-m", "pytest",
               str(EXAMPLES / "test_custom_callback_example.py"), "-q", "-p", "no:cacheprovider",
               "--rootdir", str(ROOT)]
    out = run_command(tmp_path, command).stdout
    assert "3 passed" in out and "heavy modules" not in out, out


def test_custom_callback_example_fails_when_the_callback_is_broken(tmp_path):
    # the example's tests can fail: break the callback (never stops) and the two that need a stop must
    broken = tmp_path / "test_broken_example.py"
    source = (EXAMPLES / "test_custom_callback_example.py").read_text()
    broken.write_text(source.replace("control.should_training_stop = True", "pass"))
    spec = importlib.util.spec_from_file_location("test_broken_example", broken)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = {name: test for name, test in vars(module).items() if name.startswith("test_")}
    failed = set()
    for name, test in tests.items():
        folder = tmp_path / name
        folder.mkdir()
        try:
            test(folder)
        except AssertionError:
            failed.add(name)
    assert len(tests) == 3
    assert failed == {"test_stops_at_the_first_log_below_the_threshold", "test_the_event_order_around_a_stop"}


def test_lightweight_loop_example(tmp_path, monkeypatch, capsys):
    _, out = run_main("lightweight_loop", [str(tmp_path)], tmp_path, monkeypatch, capsys)
    assert out.count("optimizer steps") == 2  # StepTimer: two epochs of 10 steps each
    assert "'model/w'" in out  # AddWeights edited the record through on_pre_log
    assert "[StopWhenGoodEnough] eval_mae=" in out and "trained 20 steps" in out
    w, b = (float(part.split("=")[1]) for part in out.split("model: ")[1].split("(")[0].split())
    assert abs(w - 2) < 0.2 and abs(b - 3) < 0.2  # the fit converged


@pytest.mark.transformers
@pytest.mark.mlflow
@pytest.mark.wandb
def test_resume_example_same_stop_step_same_tracker_runs(tmp_path, monkeypatch, capsys):
    # min_delta=10: evaluations after the first never improve; patience 2 stops at the 3rd
    # evaluation (step 9). Interrupted after step 6 (wait=1): only a restored counter stops at 9.
    module = load_example("resume")
    build = module.build

    def build_with_a_gate(output_dir, options, interrupt_at=None):
        # a gate before the simulated preemption: the tracker runs are open and hold steps 3 and 6
        # (a run that takes longer to open than a crash leaves, e.g. on a loaded machine, is another
        # case, tested in tests/loggers: its records go to their own run)
        trainer, callbacks = build(output_dir, options, interrupt_at)
        interrupt = next((cb for cb in trainer.callback_handler.callbacks
                          if isinstance(cb, module.InterruptAfterSave)), None)
        if interrupt is not None:
            preempt = interrupt.on_save

            def on_save(args, state, control, **kwargs):
                if state.global_step == interrupt.step:
                    assert callbacks["mlflow"].flush(timeout=120) and callbacks["wandb"].flush(timeout=120)
                preempt(args, state, control, **kwargs)

            interrupt.on_save = on_save
        return trainer, callbacks

    monkeypatch.setattr(module, "build", build_with_a_gate)
    _, out = run_main("resume", [str(tmp_path), "--interrupt-at", "6", "--patience", "2", "--min-delta", "10",
                                 "--compare"], tmp_path, monkeypatch, capsys)
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
def test_trl_sft_lora_example(tmp_path, monkeypatch, capsys):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    _, out = run_main("trl_sft_lora", [str(tmp_path)], tmp_path, monkeypatch, capsys)
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
def test_streaming_metrics_example(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torchmetrics")
    _, out = run_main("streaming_metrics", [str(tmp_path)], tmp_path, monkeypatch, capsys)
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


def test_an_example_runs_as_a_command_without_transformers_or_torch(tmp_path):
    # the command-line path the in-process tests skip (`python examples/<script>.py <output_dir>`),
    # on the example that claims to need neither torch nor transformers (both made unimportable)
    command = [sys.executable, str(HERE / "block_heavy_imports.py"), str(EXAMPLES / "lightweight_loop.py"),
               str(tmp_path / "out")]
    out = run_command(tmp_path, command).stdout
    assert "trained 20 steps" in out and "[StopWhenGoodEnough]" in out and "heavy modules" not in out
    assert [path.name for path in (tmp_path / "out").iterdir() if path.name.startswith("checkpoint-")]


#: What a command may do before ``main()``: process-wide settings a test process must not take (the
#: demo's: DeepSpeed hidden, while DeepSpeed's own tests share the process); the command tests run it.
COMMAND_ONLY = {"quiet_process()"}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_example_command_is_its_main(name):
    # what the command runs is what the tests run: `main(argv=None)` reading sys.argv, and nothing else
    tree = ast.parse((EXAMPLES / f"{name}.py").read_text(encoding="utf-8"))
    (main,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    assert [arg.arg for arg in main.args.args] == ["argv"] and ast.unparse(main.args.defaults[0]) == "None"
    (block,) = [node for node in tree.body if isinstance(node, ast.If)
                and ast.unparse(node.test) == "__name__ == '__main__'"]
    body = [ast.unparse(node) for node in block.body]
    assert "main()" in body and set(body[:body.index("main()")]) <= COMMAND_ONLY, ast.unparse(block)
