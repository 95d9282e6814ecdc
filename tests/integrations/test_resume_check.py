"""TrainerPlus's pre-flight ``on_resume_check`` on a real transformers.Trainer (run by `make compat` too)."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402
from transformers.trainer_utils import TrainOutput  # noqa: E402

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from hf_callbacks_plus.testing import EventRecorder  # noqa: E402
from tests.callbacks.early_stopping_helpers import saved_state  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

RUN = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "logging_steps": 1}


class ResumeListener(TrainerCallback):
    """Records on_resume_check calls; sets should_training_stop with a reason when ``veto``."""

    def __init__(self, veto: bool = False) -> None:
        self.veto, self.calls = veto, []

    def on_resume_check(self, args, state, control, checkpoint=None, reasons=None, **kwargs):
        self.calls.append((checkpoint, state, control.should_training_stop))
        if self.veto:
            control.should_training_stop = True
            reasons.append("vetoed by the test")


def test_a_veto_runs_no_training_event_and_loads_the_checkpoint(tmp_path, caplog):
    make_trainer(tmp_path, trainer_class=TrainerPlus, **RUN).train()
    recorder, listener = EventRecorder(), ResumeListener(veto=True)
    trainer = make_trainer(tmp_path, callbacks=[recorder, listener], trainer_class=TrainerPlus,
                           **{**RUN, "max_steps": 8})
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        output = trainer.train(resume_from_checkpoint=True)  # Trainer's rule: the newest checkpoint
    newest = str(tmp_path / "checkpoint-4")
    checkpoint, state, stop_before = listener.calls[0]
    assert checkpoint == newest and isinstance(state, transformers.TrainerState) and not stop_before
    assert recorder.names() == ["on_init_end"]
    assert trainer.state is state and trainer.state.global_step == 4
    assert isinstance(output, TrainOutput) and output.global_step == 4
    assert output.metrics["train_skipped"] == 1.0
    from safetensors.torch import load_file

    saved = load_file(f"{newest}/model.safetensors")
    assert all(torch.equal(trainer.model.state_dict()[k].cpu(), v) for k, v in saved.items())
    assert f"TrainerPlus: not training the run resumed from {newest} (global_step 4)" in caplog.text
    assert "vetoed by the test" in caplog.text


def test_a_listener_that_does_not_veto_changes_no_event(tmp_path, monkeypatch):
    # transformers 4.41 reads rng_state.pth with a bare torch.load, which torch >= 2.6 refuses
    # (weights_only); the file is this test's own.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    traces = []
    for name, extra in (("plain", []), ("listened", [ResumeListener()])):
        make_trainer(tmp_path / name, trainer_class=TrainerPlus, **RUN).train()
        recorder = EventRecorder()
        resumed = make_trainer(tmp_path / name, callbacks=[recorder, *extra], trainer_class=TrainerPlus,
                               **{**RUN, "max_steps": 6})
        resumed.train(resume_from_checkpoint=str(tmp_path / name / "checkpoint-2"))
        traces.append(recorder.events)
    assert traces[0] == traces[1] and "on_step_begin" in [event.event for event in traces[0]]


def test_early_stopping_vetoes_the_resume_of_a_stopped_run(tmp_path):
    def build(path):
        stopper = EarlyStopping("eval_loss", mode="max", patience=1)  # the loss falls: stops at step 4
        return make_trainer(path, callbacks=[stopper], trainer_class=TrainerPlus, eval_strategy="steps",
                            eval_steps=2, **{**RUN, "max_steps": 10}), stopper

    trainer, stopper = build(tmp_path)
    trainer.train()
    assert stopper.stopped_step == 4 == trainer.state.global_step
    # transformers < 4.45 writes callback states only at train begin; SelfRestoringState.on_save
    # writes the current one into each checkpoint, so every supported version knows it stopped.
    assert saved_state(tmp_path / "checkpoint-4", stopper.state_key)["stopped"] is True
    resumed, again = build(tmp_path)
    output = resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert resumed.state.global_step == 4 and output.metrics["train_skipped"] == 1.0 and again.stopped
