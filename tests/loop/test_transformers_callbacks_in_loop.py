"""transformers' own callbacks, reading only documented fields, run unchanged in LightweightTrainer."""

import json

import pytest

pytest.importorskip("transformers")

from transformers import EarlyStoppingCallback, PrinterCallback  # noqa: E402

from hf_callbacks_plus.loop.arguments import LoopArguments  # noqa: E402
from hf_callbacks_plus.loop.trainer import LightweightTrainer  # noqa: E402

pytestmark = pytest.mark.transformers

#: eval_loss per step: improves until step 3, then gets worse
EVAL_LOSS = {1: 1.0, 2: 0.8, 3: 0.5, 4: 0.6, 5: 0.7, 6: 0.9, 7: 1.0, 8: 1.1}


def make_trainer(tmp_path, callbacks, **overrides):
    settings = dict(
        output_dir=str(tmp_path), max_steps=8, eval_strategy="steps", eval_steps=1, save_strategy="steps",
        save_steps=1, logging_steps=1, metric_for_best_model="loss", load_best_model_at_end=True,
    )
    args = LoopArguments(**{**settings, **overrides})
    holder = {}

    def scripted_eval(data):
        return {"loss": EVAL_LOSS[holder["trainer"].state.global_step]}

    trainer = LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=list(range(8)),
                                 eval_fn=scripted_eval, callbacks=callbacks)
    holder["trainer"] = trainer
    return trainer


def test_transformers_early_stopping_callback_stops_and_is_checkpointed(tmp_path):
    stopper = EarlyStoppingCallback(early_stopping_patience=2)
    trainer = make_trainer(tmp_path, [stopper])
    trainer.train()
    # best at step 3; steps 4 and 5 do not improve: patience 2 reached at step 5
    assert trainer.state.global_step == 5
    assert trainer.state.best_metric == 0.5 and trainer.state.best_global_step == 3
    saved = json.loads((tmp_path / "checkpoint-5" / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["EarlyStoppingCallback"]["attributes"] == {
        "early_stopping_patience_counter": 2
    }


def test_transformers_printer_callback_prints_every_log(tmp_path, capsys):
    from hf_callbacks_plus.loop.default_callbacks import PrinterCallback as OurPrinterCallback

    trainer = make_trainer(tmp_path, [], save_strategy="no", load_best_model_at_end=False, disable_tqdm=True)
    trainer.remove_callback(OurPrinterCallback)  # the default printer (disable_tqdm) prints the same lines
    trainer.add_callback(PrinterCallback())
    trainer.train()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(printed) == len(trainer.state.log_history)
    assert "'eval_loss'" in printed[1] and "'train_runtime'" in printed[-1]
