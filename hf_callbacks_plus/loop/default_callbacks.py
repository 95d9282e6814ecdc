"""The callbacks transformers installs by default: DefaultFlowCallback, ProgressCallback, PrinterCallback.

The behaviour is line for line that of ``transformers.trainer_callback``. Strategies are
compared with plain strings, which matches both `LoopArguments` (strings) and
``transformers.TrainingArguments`` (``IntervalStrategy``/``SaveStrategy`` are str enums).
"""

from __future__ import annotations

from typing import Any

from .._compat import require
from ..core.callback import TrainerCallback
from ..core.state import TrainerControl, TrainerState
from .plan import has_length

__all__ = ["DefaultFlowCallback", "PrinterCallback", "ProgressCallback"]


class DefaultFlowCallback(TrainerCallback):
    """Decides when to log, evaluate, save and stop, from the ``*_strategy``/``*_steps`` args.

    Always installed first by `LightweightTrainer`,
    like transformers' own.
    """

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # transformers' strategies are str enums, so comparing with strings works for both
        logging_strategy, eval_strategy, save_strategy = (
            args.logging_strategy,
            args.eval_strategy,
            args.save_strategy,
        )
        # Log
        if state.global_step == 1 and args.logging_first_step:
            control.should_log = True
        if logging_strategy == "steps" and state.global_step % state.logging_steps == 0:
            control.should_log = True

        # Evaluate
        if (
            eval_strategy == "steps"
            and state.global_step % state.eval_steps == 0
            and args.eval_delay <= state.global_step
        ):
            control.should_evaluate = True

        # Save
        if save_strategy == "steps" and state.save_steps > 0 and state.global_step % state.save_steps == 0:
            control.should_save = True

        # End training
        if state.global_step >= state.max_steps:
            control.should_training_stop = True
            # Evaluate at the end with a step-based eval strategy, unless this step already does.
            if (
                eval_strategy == "steps"
                and state.global_step % state.eval_steps != 0
                and args.eval_delay <= state.global_step
            ):
                control.should_evaluate = True
            if save_strategy == "steps":
                control.should_save = True

        return control

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if args.logging_strategy == "epoch":
            control.should_log = True
        if args.eval_strategy == "epoch" and args.eval_delay <= state.epoch:
            control.should_evaluate = True
        if args.save_strategy == "epoch":
            control.should_save = True
        return control


class ProgressCallback(TrainerCallback):
    """Shows training and evaluation progress bars with tqdm, and writes logs under them.

    Args:
        max_str_len: Strings longer than this are replaced by a note in the printed logs.
            Defaults to 100.

    Raises:
        ModuleNotFoundError: tqdm is not installed (``pip install 'hf-callbacks-plus[progress]'``).
    """

    #: Prints every log record (``ConsoleSummary(quiet_printer=True)`` skips the ones it prints).
    prints_logs = True

    def __init__(self, max_str_len: int = 100) -> None:
        self._tqdm = require("tqdm", "ProgressCallback").tqdm
        self.training_bar: Any = None
        self.prediction_bar: Any = None
        self.max_str_len = max_str_len
        self.current_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = self._tqdm(total=state.max_steps, dynamic_ncols=True)
        self.current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if state.is_world_process_zero and has_length(eval_dataloader):
            if self.prediction_bar is None:
                self.prediction_bar = self._tqdm(
                    total=len(eval_dataloader), leave=self.training_bar is None, dynamic_ncols=True
                )
            self.prediction_bar.update(1)

    def on_evaluate(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            if self.prediction_bar is not None:
                self.prediction_bar.close()
            self.prediction_bar = None

    def on_predict(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            if self.prediction_bar is not None:
                self.prediction_bar.close()
            self.prediction_bar = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            shallow_logs = {}
            for key, value in logs.items():
                if isinstance(value, str) and len(value) > self.max_str_len:
                    shallow_logs[key] = (
                        f"[String too long to display, length: {len(value)} > {self.max_str_len}. "
                        "Consider increasing `max_str_len` if needed.]"
                    )
                elif isinstance(value, float):
                    shallow_logs[key] = f"{value:.4g}"
                else:
                    shallow_logs[key] = value
            shallow_logs.pop("total_flos", None)
            self.training_bar.write(str(shallow_logs))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar.close()
            self.training_bar = None


class PrinterCallback(TrainerCallback):
    """Prints every log record (floats with 4 significant digits), like transformers'.

    Note: like transformers', it removes ``total_flos`` from the logs it receives.
    """

    #: Prints every log record (``ConsoleSummary(quiet_printer=True)`` skips the ones it prints).
    prints_logs = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs.pop("total_flos", None)
        if state.is_local_process_zero:
            if logs is not None:
                logs = {
                    key: (f"{value:.4g}" if isinstance(value, float) else value)
                    for key, value in logs.items()
                }
            print(logs)
