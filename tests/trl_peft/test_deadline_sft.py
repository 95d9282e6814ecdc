"""Deadline in trl's SFTTrainer (wired with ``run_before_integrations``): a real signal between two
logging steps stops it with a complete checkpoint, and the resumed training ends bit-identical to an
uninterrupted one: weights, and ``log_history`` with trl's running metrics (``mean_token_accuracy``,
``entropy``: their logging window travels in the checkpoint too).

One exception, trl's own: ``num_tokens`` counts from 0 again in every resumed process (trl 1.16 keeps
the total in ``SFTTrainer._total_train_tokens``, which no checkpoint holds), after any resume."""

from __future__ import annotations

import pytest

from hf_callbacks_plus import Deadline, run_before_integrations
from tests.callbacks.deadline_helpers import SignalAt, complete, same_weights
from tests.trl_peft import runs

pytestmark = [pytest.mark.transformers, pytest.mark.second_tier]

ARGS = {"max_steps": 8, "logging_steps": 2, "eval_steps": 4, "save_strategy": "steps", "save_steps": 4,
        "per_device_train_batch_size": 4}


def sft(out, callbacks):
    trainer = runs.trainer("sft", out, callbacks=callbacks, with_subset_eval=False, **ARGS)
    run_before_integrations(trainer, *[cb for cb in callbacks if isinstance(cb, Deadline)])
    return trainer


def comparable(trainer):
    return [{k: v for k, v in record.items() if k != "num_tokens" and k != "eval_num_tokens"}
            for record in runs.history(trainer) if "train_loss" not in record]


def test_sft_trainer_stops_on_a_signal_and_resumes_bit_identical(tmp_path):
    out = tmp_path / "run"
    deadline = Deadline(margin=0)
    stopped = sft(out, [deadline, SignalAt(5, "step")])
    stopped.train()
    assert (stopped.state.global_step, deadline.exit_code) == (5, 75)
    assert complete(out / "checkpoint-5", ("model.safetensors", "optimizer.pt", "trainer_state.json"))
    resumed = sft(out, [Deadline(margin=0)])
    resumed.train(resume_from_checkpoint=True)
    reference = sft(tmp_path / "reference", [Deadline(margin=0)])
    reference.train()
    assert same_weights(resumed.model, reference.model)
    ours, theirs = comparable(resumed), comparable(reference)
    assert ours == theirs
    assert any("mean_token_accuracy" in record and record["step"] == 6 for record in ours)
