"""Testing your own callback in pytest, in milliseconds, without transformers or torch.

    pytest examples/test_custom_callback_example.py

``LightweightTrainer`` fires ``transformers.Trainer``'s events in the same order with the same
steps and control flags, from a plain Python training-step function; ``EventRecorder``
records what happened. The callback under test is an ordinary ``TrainerCallback``: the very
same class then runs in ``transformers.Trainer``. Nothing here needs transformers or torch
(``tests/examples/test_examples.py`` runs this file with both imports blocked).
"""

from __future__ import annotations

from typing import Any

from hf_callbacks_plus import LightweightTrainer, LoopArguments, TrainerCallback
from hf_callbacks_plus.testing import EventRecorder


class StopWhenLossBelow(TrainerCallback):
    """The callback under test: stops training once the logged loss is below ``threshold``,
    and adds ``stop_reason`` to that log record (``on_pre_log``, so trackers see it)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.stopped_at: int | None = None

    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs is not None and "loss" in logs and logs["loss"] < self.threshold and self.stopped_at is None:
            self.stopped_at = state.global_step
            control.should_training_stop = True
            logs["stop_reason"] = f"loss {logs['loss']:.3f} < {self.threshold}"


def make_trainer(tmp_path: Any, losses: list[float], callbacks: list[Any],
                 **overrides: Any) -> LightweightTrainer:
    """A loop whose step ``i`` returns ``losses[i]``; 10 batches per epoch."""
    values = iter(losses)
    arguments = {"output_dir": str(tmp_path), "max_steps": len(losses), "logging_steps": 2,
                 "save_strategy": "no", "disable_tqdm": True, **overrides}
    return LightweightTrainer(LoopArguments(**arguments), train_step=lambda batch: next(values),
                              train_data=list(range(10)), callbacks=callbacks)


def test_stops_at_the_first_log_below_the_threshold(tmp_path):
    callback = StopWhenLossBelow(0.5)
    recorder = EventRecorder(custom_events=["on_pre_log"])
    trainer = make_trainer(tmp_path, [1.0, 0.9, 0.8, 0.6, 0.45, 0.4, 0.3, 0.2], [callback, recorder])
    trainer.train()

    assert callback.stopped_at == 6          # logs at 2, 4, 6: mean loss over steps 5-6 is 0.425
    assert trainer.state.global_step == 6    # training stopped right after that step
    assert recorder.steps("on_log")[:3] == [2, 4, 6]
    assert "should_training_stop" in recorder.of("on_pre_log")[2].flags
    stop_record = next(r for r in trainer.state.log_history if "stop_reason" in r)
    assert stop_record["step"] == 6 and stop_record["stop_reason"] == "loss 0.425 < 0.5"


def test_never_stops_when_the_loss_stays_high(tmp_path):
    callback = StopWhenLossBelow(0.1)
    recorder = EventRecorder()
    make_trainer(tmp_path, [1.0] * 8, [callback, recorder]).train()

    assert callback.stopped_at is None
    assert recorder.steps("on_step_end") == list(range(1, 9))
    assert recorder.names()[-1] == "on_train_end"


def test_the_event_order_around_a_stop(tmp_path):
    recorder = EventRecorder(skip=["on_substep_end", "on_pre_optimizer_step", "on_optimizer_step"])
    make_trainer(tmp_path, [0.3, 0.2, 0.1, 0.1], [StopWhenLossBelow(0.5), recorder]).train()

    assert recorder.names() == [
        "on_init_end", "on_train_begin", "on_epoch_begin",
        "on_step_begin", "on_step_end",
        "on_step_begin", "on_step_end", "on_log",   # stop decided at this log
        "on_epoch_end", "on_log",                   # the final train_runtime/train_loss record
        "on_train_end",
    ]

