"""``TrainerPlus(resume_from_checkpoint=True)`` skips a newer checkpoint left incomplete by a failed save.

A full disk during a save leaves ``checkpoint-6`` with a truncated weights file and no
``trainer_state.json`` (transformers writes the state last). A stock Trainer resumes from it
and fails loading it; TrainerPlus resumes from the newest complete checkpoint and says so.
"""

from __future__ import annotations

import logging
import os

import pytest

pytest.importorskip("transformers")

from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from hf_callbacks_plus.testing import EventRecorder  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

RUN = {"max_steps": 6, "save_strategy": "steps", "save_steps": 2, "logging_steps": 1}


def interrupt_save(checkpoint) -> None:
    """What a save cut short by a full disk leaves: a truncated weights file, no trainer state."""
    (checkpoint / "trainer_state.json").unlink()
    weights = checkpoint / "model.safetensors"
    if weights.exists():
        with open(weights, "r+b") as handle:
            handle.truncate(os.path.getsize(weights) // 2)


@pytest.fixture(autouse=True)
def _old_transformers_can_resume(monkeypatch):
    # transformers < 4.46 reads rng_state.pth with a bare torch.load, which torch >= 2.6 refuses
    # (weights_only); the files are this test's own.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


def test_resume_true_skips_the_incomplete_newest_checkpoint(tmp_path, caplog):
    make_trainer(tmp_path, trainer_class=TrainerPlus, **RUN).train()
    interrupt_save(tmp_path / "checkpoint-6")
    recorder = EventRecorder()
    trainer = make_trainer(tmp_path, callbacks=[recorder], trainer_class=TrainerPlus,
                           **{**RUN, "max_steps": 8})
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        output = trainer.train(resume_from_checkpoint=True)
    assert recorder.of("on_train_begin")[0].global_step == 4  # resumed from checkpoint-4
    assert output.global_step == 8
    warnings = [r.getMessage() for r in caplog.records if r.name == "hf_callbacks_plus" and r.levelno >= 30]
    assert len(warnings) == 1
    assert f"{tmp_path / 'checkpoint-6'} (no trainer_state.json)" in warnings[0]
    assert f"resumes from {tmp_path / 'checkpoint-4'}" in warnings[0]


def test_every_checkpoint_incomplete_is_a_clear_error(tmp_path):
    make_trainer(tmp_path, trainer_class=TrainerPlus, **{**RUN, "max_steps": 2}).train()
    interrupt_save(tmp_path / "checkpoint-2")
    trainer = make_trainer(tmp_path, trainer_class=TrainerPlus, **RUN)
    expected = r"no complete checkpoint in .*checkpoint-2 \(no trainer_state"
    with pytest.raises(FileNotFoundError, match=expected):  # what transformers raises there
        trainer.train(resume_from_checkpoint=True)


def test_an_explicit_path_and_no_checkpoint_behave_like_transformers(tmp_path):
    make_trainer(tmp_path, trainer_class=TrainerPlus, **RUN).train()
    interrupt_save(tmp_path / "checkpoint-6")
    trainer = make_trainer(tmp_path, trainer_class=TrainerPlus, **{**RUN, "max_steps": 8})
    output = trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))  # the path is kept
    assert output.global_step == 8
    empty = make_trainer(tmp_path / "empty", trainer_class=TrainerPlus, **RUN)
    os.makedirs(tmp_path / "empty", exist_ok=True)
    with pytest.raises(ValueError, match="No valid checkpoint found"):  # transformers' own error
        empty.train(resume_from_checkpoint=True)
