"""``LightweightTrainer.train(resume_from_checkpoint=True)`` resumes from the newest complete checkpoint."""

from __future__ import annotations

import logging
import os

import pytest

from hf_callbacks_plus.core.checkpoint_folders import incomplete_reason, newest_complete_checkpoint
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments
from hf_callbacks_plus.loop.checkpoints import MODEL_STATE_NAME
from hf_callbacks_plus.testing import EventRecorder


class Model:
    """A model with ``state_dict``/``load_state_dict``: the loop pickles it into checkpoints."""

    def __init__(self) -> None:
        self.weight = 0.0

    def state_dict(self):
        return {"weight": self.weight}

    def load_state_dict(self, state):
        self.weight = state["weight"]


def make(output_dir, max_steps, callbacks=()):
    model = Model()

    def train_step(batch):
        model.weight += 1.0
        return 1.0

    args = LoopArguments(output_dir=str(output_dir), max_steps=max_steps, logging_steps=1,
                         save_strategy="steps", save_steps=2, disable_tqdm=True)
    return LightweightTrainer(args, train_step=train_step, train_data=[[0.0]] * 4, model=model,
                              callbacks=list(callbacks))


def interrupt_save(checkpoint) -> None:
    """What a save cut short by a full disk leaves: a truncated weights file, no trainer state."""
    os.remove(checkpoint / "trainer_state.json")
    with open(checkpoint / MODEL_STATE_NAME, "r+b") as handle:
        handle.truncate(3)


def test_resume_true_skips_incomplete_newer_checkpoints_with_one_warning(tmp_path, caplog):
    make(tmp_path, max_steps=6).train()
    interrupt_save(tmp_path / "checkpoint-6")
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text('{"global_st', encoding="utf-8")  # cut
    recorder = EventRecorder()
    trainer = make(tmp_path, max_steps=8, callbacks=[recorder])
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        output = trainer.train(resume_from_checkpoint=True)
    assert recorder.of("on_train_begin")[0].global_step == 2  # checkpoint-2, the newest complete one
    assert trainer.model.weight == 2.0 + 6  # its weights, then six more steps
    assert output.global_step == 8
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert f"{tmp_path / 'checkpoint-6'} (no trainer_state.json)" in warnings[0]
    assert f"{tmp_path / 'checkpoint-4'} (unreadable trainer_state.json (JSONDecodeError" in warnings[0]
    assert f"resumes from {tmp_path / 'checkpoint-2'}" in warnings[0]


def test_every_checkpoint_incomplete_or_none_at_all_is_a_clear_error(tmp_path):
    make(tmp_path, max_steps=2).train()
    interrupt_save(tmp_path / "checkpoint-2")
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint in output_dir=.*every checkpoint-N "
                                         r"folder is incomplete: .*checkpoint-2 \(no trainer_state.json\)"):
        make(tmp_path, max_steps=4).train(resume_from_checkpoint=True)
    with pytest.raises(ValueError, match="no valid checkpoint-N folder found"):
        make(tmp_path / "empty", max_steps=4).train(resume_from_checkpoint=True)


def test_completeness_is_read_from_the_state_file(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    assert incomplete_reason(folder) == "no trainer_state.json"
    (folder / "trainer_state.json").write_text("[]", encoding="utf-8")
    assert incomplete_reason(folder) == "trainer_state.json holds no global_step"
    (folder / "trainer_state.json").write_text('{"global_step": 3}', encoding="utf-8")
    assert incomplete_reason(folder) is None
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint name: ignored
    assert newest_complete_checkpoint(tmp_path, trainer_name="T") == str(folder)
