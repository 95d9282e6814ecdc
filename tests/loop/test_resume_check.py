"""LightweightTrainer's pre-flight ``on_resume_check`` (no torch, no transformers needed)."""

from __future__ import annotations

import logging

from hf_callbacks_plus.core.resume_check import TRAIN_SKIPPED_METRIC
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments, TrainerCallback, TrainerState
from hf_callbacks_plus.testing import EventRecorder


class ResumeListener(TrainerCallback):
    """Records every on_resume_check call; vetoes the run when ``veto`` (with ``reason`` if given)."""

    def __init__(self, veto: bool = False, reason: str = "") -> None:
        self.veto, self.reason, self.calls = veto, reason, []

    def on_resume_check(self, args, state, control, checkpoint=None, reasons=None, **kwargs):
        self.calls.append((checkpoint, state, dict(vars(control)), kwargs.get("model")))
        if self.veto:
            control.should_training_stop = True
            if self.reason:
                reasons.append(self.reason)


def make(output_dir, callbacks=(), max_steps=4, seen=None, loaded=None):
    def train_step(batch):
        if seen is not None:
            seen.append(batch[0])
        return 1.0

    args = LoopArguments(output_dir=str(output_dir), disable_tqdm=True, max_steps=max_steps, logging_steps=1,
                         save_strategy="steps", save_steps=2)
    return LightweightTrainer(args, train_step=train_step, train_data=[[i] for i in range(8)],
                              callbacks=list(callbacks), model="the-model",
                              save_model_fn=lambda path: None,
                              load_model_fn=(loaded.append if loaded is not None else None))


def test_a_veto_runs_no_training_event_and_takes_the_checkpoint_state(tmp_path, caplog):
    make(tmp_path).train()
    recorder, veto = EventRecorder(), ResumeListener(veto=True, reason="the run is done")
    seen, loaded = [], []
    trainer = make(tmp_path, [recorder, veto], max_steps=8, seen=seen, loaded=loaded)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        output = trainer.train(resume_from_checkpoint=True)  # resolves to the newest: checkpoint-4
    assert recorder.names() == ["on_init_end"] and seen == []
    assert loaded == [str(tmp_path / "checkpoint-4")]  # the weights are the checkpoint's
    checkpoint, state, control, model = veto.calls[0]
    assert checkpoint == str(tmp_path / "checkpoint-4") and model == "the-model"
    assert isinstance(state, TrainerState) and state.global_step == 4 and not any(control.values())
    assert trainer.state is state and trainer.state.global_step == 4 and len(trainer.state.log_history) == 4
    assert output.global_step == 4 and output.training_loss == 0.0
    assert output.metrics[TRAIN_SKIPPED_METRIC] == 1.0
    lines = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "not training" in lines[0].getMessage()
    assert "checkpoint-4" in lines[0].getMessage() and "the run is done" in lines[0].getMessage()


def test_a_veto_without_a_reason_names_the_listening_callbacks(tmp_path, caplog):
    make(tmp_path).train()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        make(tmp_path, [ResumeListener(veto=True)]).train(resume_from_checkpoint=tmp_path / "checkpoint-2")
    assert "ResumeListener set control.should_training_stop in on_resume_check" in caplog.text


def test_a_listener_that_does_not_veto_changes_no_event(tmp_path):
    make(tmp_path / "first").train()
    traces = []
    for name, extra in (("plain", []), ("listened", [ResumeListener()])):
        recorder = EventRecorder()
        make(tmp_path / name).train()
        make(tmp_path / name, [recorder, *extra], max_steps=8).train(
            resume_from_checkpoint=str(tmp_path / name / "checkpoint-2"))
        traces.append(recorder.events)
        if extra:
            assert len(extra[0].calls) == 1
    assert traces[0] == traces[1] and "on_step_begin" in [event.event for event in traces[0]]


def test_not_fired_on_a_fresh_run(tmp_path):
    listener = ResumeListener(veto=True)
    output = make(tmp_path, [listener]).train()
    assert listener.calls == [] and output.global_step == 4 and TRAIN_SKIPPED_METRIC not in output.metrics
