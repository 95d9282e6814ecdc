"""Handler edges, side by side with a stock ``transformers.Trainer`` : what a
stock Trainer does with an odd callback or an odd resume, our runners do too (``TrainerPlus``, a
stock Trainer after ``run_before_integrations``, ``LightweightTrainer``)."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.transformers
transformers = pytest.importorskip("transformers")

from hf_callbacks_plus.integrations.ordering import run_before_integrations  # noqa: E402
from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

RUNNERS = ["stock", "trainerplus", "wired", "lightweight"]


def runner(kind: str, output_dir, callbacks=()):
    if kind == "lightweight":
        from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

        args = LoopArguments(output_dir=str(output_dir), max_steps=2, save_strategy="no", disable_tqdm=True)
        return LightweightTrainer(args, train_step=lambda batch: 1.0, train_data=[1, 2],
                                  callbacks=list(callbacks))
    trainer = make_trainer(output_dir, callbacks=callbacks, max_steps=2,
                           trainer_class=TrainerPlus if kind == "trainerplus" else None)
    if kind == "wired":
        run_before_integrations(trainer)
    return trainer


class NotACallback:
    """Neither a TrainerCallback nor an object with the events."""


class OwnBind(transformers.TrainerCallback):
    """A user's callback with a ``bind()`` of its own (not our ``bind(trainer)``)."""

    def __init__(self):
        self.bound = 0

    def bind(self):
        self.bound += 1


@pytest.mark.parametrize("kind", RUNNERS)
def test_an_object_without_the_events_raises_like_a_stock_trainer(tmp_path, kind):
    """An object without the callback events fails the run as in a stock Trainer."""
    trainer = runner(kind, tmp_path)
    trainer.add_callback(NotACallback())
    with pytest.raises(AttributeError, match=r"^'NotACallback' object has no attribute 'on_train_begin'$"):
        trainer.train()


@pytest.mark.parametrize("kind", RUNNERS)
def test_a_callbacks_own_zero_argument_bind_is_left_alone(tmp_path, kind):
    """A callback's own ``bind()`` without arguments is not our binding protocol: never called."""
    callback = OwnBind()
    trainer = runner(kind, tmp_path, [callback])
    trainer.add_callback(OwnBind())
    trainer.train()
    assert trainer.state.global_step == 2 and callback.bound == 0


@pytest.mark.parametrize("kind", RUNNERS)
def test_the_duplicate_callback_warning_is_transformers_own(tmp_path, kind, caplog, monkeypatch):
    """Same logger and text as a stock Trainer, so transformers' verbosity governs it."""
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    messages = {}
    for name in ("stock", kind):
        trainer = runner(name, tmp_path / name, [transformers.PrinterCallback()])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            trainer.add_callback(transformers.PrinterCallback)
        messages[name] = [(r.name, r.getMessage().split(":")[0]) for r in caplog.records
                          if "already one" in r.getMessage()]
    assert messages[kind] == messages["stock"]
    assert messages["stock"] and messages["stock"][0][0] == "transformers.trainer_callback"


@pytest.mark.parametrize("kind", ["stock", "trainerplus", "wired"])
def test_resume_true_with_only_a_save_model_folder_raises_what_a_stock_trainer_raises(tmp_path, kind):
    """``save_model(output_dir/checkpoint-5)`` leaves a checkpoint folder without a trainer state:
    a stock Trainer raises FileNotFoundError (before, TrainerPlus raised ValueError)."""
    trainer = runner(kind, tmp_path)
    trainer.save_model(str(tmp_path / "checkpoint-5"))
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        trainer.train(resume_from_checkpoint=True)
