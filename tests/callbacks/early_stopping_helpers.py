"""Shared helpers for the EarlyStopping tests: scripted metrics keyed by the trainer's step.

``scripted_trainer`` builds a real ``transformers.Trainer`` (tests/tiny_models.py) whose
``compute_metrics`` returns ``{name: script(global_step)}``, so a stop is deterministic and
the same on a resumed run (the value depends only on the step, not on how many evaluations
this process made).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Union

from tests.tiny_models import make_trainer

Script = Union[Callable[[int], float], dict, list]


def value_at(script: Script, step: int) -> float:
    """The scripted value at ``step``: a callable, a dict (step -> value) or a list (index = step)."""
    if callable(script):
        return float(script(step))
    if isinstance(script, dict):
        return float(script[step])
    return float(script[min(step, len(script) - 1)])


def scripted_trainer(output_dir: Any, script: Script, callbacks=(), name: str = "score",
                     trainer_class: Any = None, **args: Any):
    """A stock Trainer evaluating every ``eval_steps`` with a scripted ``eval_<name>``."""
    holder: dict[str, Any] = {}

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        return {name: value_at(script, holder["trainer"].state.global_step)}

    defaults: dict[str, Any] = {"eval_strategy": "steps", "eval_steps": 2, "max_steps": 24,
                                "logging_steps": 2, "learning_rate": 0.01}
    defaults.update(args)
    trainer = make_trainer(output_dir, callbacks=callbacks, compute_metrics=compute_metrics,
                           trainer_class=trainer_class, **defaults)
    holder["trainer"] = trainer
    return trainer


def checkpoint_steps(output_dir: Any) -> list[int]:
    """Steps of the ``checkpoint-N`` directories, ascending."""
    return sorted(int(p.name.split("-")[1]) for p in Path(output_dir).glob("checkpoint-*"))


def saved_state(checkpoint: Any, key: str) -> dict:
    """The saved attributes of the EarlyStopping instance ``key`` in a checkpoint (the last entry:
    transformers appends one per save when a class has several instances)."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    entries = state["stateful_callbacks"]["EarlyStopping"]
    for entry in reversed(entries if isinstance(entries, list) else [entries]):
        if entry["attributes"]["state_key"] == key:
            return entry["attributes"]
    raise KeyError(key)


def scripted_loop(output_dir: Any, script: Script, callbacks=(), name: str = "score", *,
                  batches_per_epoch: int = 8, eval_data: Any = None, **args: Any):
    """The same run as `scripted_trainer` in ``LightweightTrainer``, in plain Python (no torch,
    no transformers): 8 steps per epoch, training loss 1.0, ``eval_<name>`` scripted by step."""
    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

    arguments: dict[str, Any] = {"output_dir": str(output_dir), "eval_strategy": "steps", "eval_steps": 2,
                                 "max_steps": 24, "logging_steps": 2, "save_strategy": "no",
                                 "disable_tqdm": True}
    arguments.update(args)
    holder: dict[str, Any] = {}

    def eval_fn(_data: Any) -> dict[str, float]:
        return {name: value_at(script, holder["trainer"].state.global_step), "loss": 1.0}

    trainer = LightweightTrainer(LoopArguments(**arguments), train_step=lambda batch: 1.0,
                                 train_data=list(range(batches_per_epoch)), eval_data=eval_data,
                                 eval_fn=eval_fn, callbacks=list(callbacks))
    holder["trainer"] = trainer
    return trainer


def scripted_lightweight(output_dir: Any, script: Script, callbacks=(), name: str = "score", **args: Any):
    """The same run as :func:`scripted_trainer` in ``LightweightTrainer``, on the real tiny model."""
    import torch

    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments
    from tests.tiny_models import RegressionDataset, TinyRegressionModel, training_args

    defaults: dict[str, Any] = {"eval_strategy": "steps", "eval_steps": 2, "max_steps": 24,
                                "logging_steps": 2, "learning_rate": 0.01}
    defaults.update(args)
    loop_args = LoopArguments.from_training_arguments(training_args(output_dir, **defaults))
    torch.manual_seed(loop_args.seed)
    model = TinyRegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=loop_args.learning_rate)
    data = RegressionDataset(64, seed=1)
    batch = loop_args.per_device_train_batch_size
    train_data = [{"input_x": data.x[i:i + batch], "labels": data.y[i:i + batch]}
                  for i in range(0, len(data), batch)]
    holder: dict[str, Any] = {}

    def train_step(inputs: dict) -> float:
        loss = model(**inputs)["loss"]
        loss.backward()
        return float(loss.detach())

    def eval_fn(_data: Any) -> dict[str, float]:
        return {name: value_at(script, holder["trainer"].state.global_step), "loss": 1.0}

    trainer = LightweightTrainer(loop_args, train_step=train_step, train_data=train_data, eval_data=None,
                                 eval_fn=eval_fn, model=model, optimizer=optimizer, callbacks=list(callbacks))
    holder["trainer"] = trainer
    return trainer


#: Scripted eval_score for the resume tests (one value per evaluation at steps 2, 4, ...):
#: best 2.5 at step 10, then three evaluations without improvement -> stop at step 16 (patience 3).
RESUME_VALUES = (5.0, 4.0, 3.0, 3.5, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1, 3.2)


def RESUME_SCRIPT(step: int) -> float:  # noqa: N802 - a constant-like script
    """``RESUME_VALUES`` by evaluation index (evaluation every 2 steps)."""
    return RESUME_VALUES[min(max(step // 2 - 1, 0), len(RESUME_VALUES) - 1)]
