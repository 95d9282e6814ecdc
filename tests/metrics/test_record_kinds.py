"""Which record a log record is (a training record, an evaluation's, the end-of-training summary):
one answer in ``metrics/keys.py`` that every reader shares.

The class under test: ``include_num_input_tokens_seen`` puts ``train_runtime`` and
``train_tokens_per_second`` into every training record (transformers' ``Trainer.log`` and the
lightweight loop's), which once made each training record read as the end-of-training summary:
``Deadline`` and ``KeepBestCheckpoints`` added their end-of-training keys to every training record,
``ConsoleSummary`` printed no training line, and the plot and the loggers took the training loss
for a run total. Real runs (a stock ``Trainer`` and ``LightweightTrainer``), each record's kind
known by construction (what produced it).
"""

from __future__ import annotations

import pytest

from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
from hf_callbacks_plus.callbacks.console_summary import ConsoleSummary
from hf_callbacks_plus.callbacks.deadline import Deadline
from hf_callbacks_plus.metrics.keys import KeyGrammar, evaluation_prefix, is_training_record
from hf_callbacks_plus.plotting import collect_curves

TOKENS = ("no", "all")


def stock(tmp_path, callbacks, tokens):
    pytest.importorskip("transformers")
    from transformers import Trainer

    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from tests.tiny_models import lm_rows, tiny_causal_lm, training_args

    args = training_args(tmp_path, include_num_input_tokens_seen=tokens, logging_steps=2, max_steps=8,
                         eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=4,
                         learning_rate=1e-3)
    trainer = Trainer(model=tiny_causal_lm(), args=args, train_dataset=lm_rows(32),
                      eval_dataset=lm_rows(8, seed=1), callbacks=callbacks)
    run_before_integrations(trainer)
    return trainer


def loop(tmp_path, callbacks, tokens):
    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

    data = [[float(i % 5), float(i % 3)] for i in range(16)]
    args = LoopArguments(output_dir=str(tmp_path), max_steps=8, logging_steps=2, eval_steps=4,
                         eval_strategy="steps", save_strategy="steps", save_steps=4,
                         include_num_input_tokens_seen=tokens)
    return LightweightTrainer(args, train_step=lambda batch: float(sum(batch)) / 10, train_data=data,
                              eval_data=[[1.0, 2.0], [0.5, 1.5]],
                              eval_step=lambda batch: float(sum(batch)) / 7, callbacks=callbacks,
                              learning_rate_fn=lambda: 0.01, num_tokens_fn=len)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("runner", [stock, loop], ids=["stock", "loop"])
def test_every_reader_tells_training_evaluation_and_summary_records_apart(tmp_path, capsys, runner, tokens):
    callbacks = [Deadline(signals=["SIGUSR1"], verbose=False),
                 KeepBestCheckpoints("eval_loss", verbose=False),
                 ConsoleSummary()]
    trainer = runner(tmp_path, callbacks, tokens)
    capsys.readouterr()
    trainer.train()
    printed = capsys.readouterr().out.splitlines()
    history = trainer.state.log_history
    truth = ["summary" if "train_loss" in record else "evaluation" if "eval_loss" in record else "training"
             for record in history]
    assert truth.count("training") == 4 and truth.count("evaluation") == 2 and truth[-1] == "summary"
    if tokens == "all":  # the case this test is about
        assert all("train_runtime" in record for record, kind in zip(history, truth) if kind == "training")
    for record, kind in zip(history, truth):
        assert is_training_record(record) == (kind == "training"), record
        assert (evaluation_prefix(record) == "eval") == (kind == "evaluation"), record
        assert KeyGrammar.is_summary_record(record) == (kind == "summary"), record
        ends = {key for key in record if key.startswith(("deadline/", "best_checkpoints/"))}
        assert bool(ends) == (kind == "summary"), record  # the end-of-training keys: once, at the end
    assert history[-1]["deadline/reason"] == "completed"
    steps = [record["step"] for record, kind in zip(history, truth) if kind == "training"]
    assert [line for line in printed if line.startswith("step ") and "| loss " in line] == \
        [line for line in printed if line.startswith(tuple(f"step {step}/8 " for step in steps))
         and "eval_loss" not in line]
    assert sum("| loss " in line for line in printed) == len(steps)
    assert not [line for line in printed if line.lstrip().startswith("{'loss'")]
    curves = collect_curves(history)
    assert [step for step, _ in curves.series["loss"]["training loss"]] == steps
