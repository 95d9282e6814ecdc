"""restore_best in LightweightTrainer with a model that is not a torch module (no torch needed).

The protocol: ``state_dict()`` / ``load_state_dict(state)``, as the ``LinearModel`` of
examples/lightweight_loop.py has. A model without them, or no model, is refused at train
begin, before any step runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments, TrainerCallback

#: eval_score by step: best at 4, then three evaluations without improvement -> stop at 10.
SCRIPT = {2: 5.0, 4: 3.0, 6: 3.5, 8: 3.4, 10: 3.3, 12: 3.2}


def _example_linear_model() -> type:
    """The ``LinearModel`` of examples/lightweight_loop.py itself."""
    path = Path(__file__).resolve().parents[2] / "examples" / "lightweight_loop.py"
    spec = importlib.util.spec_from_file_location("lightweight_loop_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LinearModel


LinearModel = _example_linear_model()


class RecordWeights(TrainerCallback):
    def __init__(self) -> None:
        self.weights: dict[int, dict] = {}

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = dict(model.state_dict())


def make_loop(tmp_path, model, callbacks, save_strategy="no"):
    holder = {}

    def train_step(batch):
        model.w += 0.1 * batch
        model.b -= 0.05
        return 1.0

    def eval_fn(_data):
        return {"score": SCRIPT[holder["trainer"].state.global_step]}

    args = LoopArguments(output_dir=str(tmp_path), max_steps=12, eval_strategy="steps", eval_steps=2,
                         logging_steps=2, save_strategy=save_strategy, save_steps=2, disable_tqdm=True)
    trainer = LightweightTrainer(args, train_step=train_step, train_data=[1.0, 2.0, 3.0], eval_fn=eval_fn,
                                 model=model, callbacks=callbacks)
    holder["trainer"] = trainer
    return trainer


@pytest.mark.parametrize("save_strategy", ["no", "steps"])
def test_restores_the_best_state_dict_of_a_plain_python_model(tmp_path, save_strategy):
    model, recorder = LinearModel(), RecordWeights()
    stopper = EarlyStopping("eval_score", mode="min", patience=3, restore_best=True)
    make_loop(tmp_path, model, [stopper, recorder], save_strategy).train()
    assert (stopper.best_step, stopper.stopped_step) == (4, 10)
    assert recorder.weights[10] != recorder.weights[4]
    assert model.state_dict() == recorder.weights[4]


class NoStateDict:
    w = 0.0


def test_a_model_without_the_protocol_is_refused_at_train_begin(tmp_path):
    stopper = EarlyStopping("eval_score", mode="min", restore_best=True)
    trainer = make_loop(tmp_path, NoStateDict(), [stopper])
    with pytest.raises(TypeError, match=r"NoStateDict.*state_dict.*load_state_dict"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_no_model_is_refused_at_train_begin(tmp_path):
    stopper = EarlyStopping("eval_score", mode="min", restore_best=True)
    trainer = make_loop(tmp_path, None, [stopper])
    trainer.callback_handler.model = None
    with pytest.raises(ValueError, match="model=None"):
        trainer.train()
    assert trainer.state.global_step == 0
