"""JsonlLogger in a stock Trainer and in LightweightTrainer; resume without duplicated steps."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest

from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from hf_callbacks_plus.loop.arguments import LoopArguments
from hf_callbacks_plus.loop.trainer import LightweightTrainer
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_stock_trainer_lines(tmp_path):
    trainer = make_trainer(tmp_path, callbacks=[JsonlLogger()], logging_steps=2, eval_strategy="steps",
                           eval_steps=4, max_steps=8)
    trainer.train()
    lines = read(tmp_path / "metrics.jsonl")
    assert lines[0]["event"] == "start"
    assert lines[-1]["event"] == "finish" and lines[-1]["status"] == "FINISHED"
    logs = [line for line in lines if line["event"] == "log"]
    assert [line["step"] for line in logs if "train/loss" in line["curves"]] == [2, 4, 6, 8]
    assert [line["step"] for line in logs if "eval/mse" in line["curves"]] == [4, 8]
    assert "train_summary/runtime" in logs[-1]["summary"] and not logs[-1]["curves"]
    params = next(line for line in lines if line["event"] == "params")["params"]
    assert params["logging_steps"] == "2"


def test_resume_continues_the_run_and_never_logs_a_step_twice(tmp_path):
    trainer = make_trainer(tmp_path, callbacks=[JsonlLogger()], logging_steps=2, save_strategy="steps",
                           save_steps=4, max_steps=12)
    trainer.train()
    # the "crash" happened after step 12, the last usable checkpoint is step 4
    trainer = make_trainer(tmp_path, callbacks=[JsonlLogger()], logging_steps=2, save_strategy="steps",
                           save_steps=4, max_steps=12)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    lines = read(tmp_path / "metrics.jsonl")
    starts = [line for line in lines if line["event"] == "start"]
    assert len(starts) == 2 and starts[0]["run_id"] == starts[1]["run_id"] and starts[1]["resumed"]
    counts = Counter((key, line["step"]) for line in lines if line["event"] == "log"
                     for key in line["curves"])
    assert counts and max(counts.values()) == 1
    assert sorted(step for key, step in counts if key == "train/loss") == [2, 4, 6, 8, 10, 12]
    assert sum(1 for line in lines if line["event"] == "params") == 1  # config logged once per run


def lightweight(tmp_path, callbacks, fail_at=None, **overrides):
    args = LoopArguments(output_dir=str(tmp_path), logging_steps=1, max_steps=4, disable_tqdm=True,
                         logging_nan_inf_filter=False, **overrides)
    calls = {"n": 0}

    def step(batch):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("boom")
        return {"loss": float("nan") if calls["n"] == 2 else 1.0 / calls["n"]}

    return LightweightTrainer(args, train_step=step, train_data=[[1.0]] * 4, callbacks=callbacks,
                              learning_rate_fn=lambda: 0.1)


def test_lightweight_trainer_and_nonfinite_policy(tmp_path):
    lightweight(tmp_path, [JsonlLogger()]).train()
    lines = read(tmp_path / "metrics.jsonl")
    losses = {line["step"]: line["curves"]["train/loss"] for line in lines
              if line["event"] == "log" and "train/loss" in line["curves"]}
    assert losses[2] == "NaN" and losses[1] == 1.0  # kept, as strict JSON
    assert lines[-1]["status"] == "FINISHED"


def test_lightweight_trainer_exception_marks_failed(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        lightweight(tmp_path, [JsonlLogger(nonfinite="drop")], fail_at=3).train()
    lines = read(tmp_path / "metrics.jsonl")
    assert lines[-1]["event"] == "finish" and lines[-1]["status"] == "FAILED"
    losses = [line["step"] for line in lines if line["event"] == "log" and "train/loss" in line["curves"]]
    assert losses == [1]  # the loss of step 2 was NaN: dropped under nonfinite="drop"
    assert any(line.get("step") == 2 and "train/learning_rate" in line.get("curves", {}) for line in lines)


def test_bad_configuration_errors():
    with pytest.raises(ValueError, match="nonfinite"):
        JsonlLogger(nonfinite="zero")
    with pytest.raises(TypeError, match="path"):
        JsonlLogger(path=3)


class FakeBadValues(TrainerCallback):
    """Placed before the logger: adds a list value and makes the loss NaN in every log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            logs["histogram"] = [1, 2, 3]
            logs["loss"] = float("nan")


def test_dropped_value_warning_once_per_key_not_per_step(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        make_trainer(tmp_path, callbacks=[FakeBadValues(), JsonlLogger(nonfinite="drop")], logging_steps=1,
                     max_steps=5).train()
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "'train/histogram'" in m]) == 1, messages
    assert len([m for m in messages if "non-finite" in m and "'train/loss'" in m]) == 1, messages
    lines = read(tmp_path / "metrics.jsonl")
    logged = [line for line in lines if line["event"] == "log" and "train/grad_norm" in line["curves"]]
    assert len(logged) == 5
    assert not any({"train/loss", "train/histogram"} & set(line["curves"]) for line in logged)


def test_trainer_plus(tmp_path):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    class AddOnPreLog(TrainerCallback):
        """A custom event TrainerPlus fires before on_log: the logger sees the added key."""

        def on_pre_log(self, args, state, control, logs=None, **kwargs):
            logs["custom/extra"] = float(state.global_step)

    trainer = make_trainer(tmp_path, callbacks=[AddOnPreLog(), JsonlLogger()], trainer_class=TrainerPlus,
                           logging_steps=2, eval_strategy="steps", eval_steps=4, max_steps=8)
    trainer.train()
    lines = read(tmp_path / "metrics.jsonl")
    logs = [line for line in lines if line["event"] == "log"]
    assert [line["step"] for line in logs if "train/loss" in line["curves"]] == [2, 4, 6, 8]
    assert [line["step"] for line in logs if "eval/mse" in line["curves"]] == [4, 8]
    extra = [(line["step"], line["curves"]["custom/extra"]) for line in logs
             if "custom/extra" in line["curves"]]
    assert extra == [(step, float(step)) for step in (2, 4, 6, 8)]  # a repeat is not written twice
    assert lines[-1]["status"] == "FINISHED"


def test_a_file_ending_mid_line_is_closed_before_appending(tmp_path, caplog):
    """A partial last line (a process killed mid-write) is ended before the next process appends,
    so its first record is a line of its own."""
    import json
    import logging

    from hf_callbacks_plus.loggers.jsonl import JsonlLogger
    from tests.tiny_models import make_trainer

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "log", "step": 1, "loss": 1.0}\n{"event": "log", "st')
    logger = JsonlLogger(str(path))
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        make_trainer(tmp_path / "out", callbacks=[logger], max_steps=2, logging_steps=1).train()
    lines = path.read_text().splitlines()
    assert lines[1] == '{"event": "log", "st'  # left as it is, on its own line
    parsed = [json.loads(line) for line in lines[2:]]
    assert parsed[0]["event"] == "start" and any(r.get("step") == 2 for r in parsed)
    assert "middle of a line" in caplog.text


def test_a_directory_as_the_path_is_refused_at_construction(tmp_path):
    import pytest

    from hf_callbacks_plus.loggers.jsonl import JsonlLogger

    with pytest.raises(ValueError, match=r"is a directory.*metrics\.jsonl"):
        JsonlLogger(str(tmp_path))
