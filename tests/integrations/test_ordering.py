"""run_before_integrations on a stock transformers.Trainer (run by `make compat` too)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers.integrations import TensorBoardCallback  # noqa: E402
from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.core.handler import CallbackHandler  # noqa: E402
from hf_callbacks_plus.integrations.ordering import (  # noqa: E402
    fires_pre_log,
    is_integration_callback,
    run_before_integrations,
    use_our_handler,
)
from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from tests.integrations.tensorboard_events import read_scalars  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

EVAL_EVERY = {"eval_strategy": "steps", "eval_steps": 4, "logging_steps": 4, "max_steps": 8}


class FixLogs(TrainerCallback):
    """Adds ``eval_extra`` to eval records and renames nothing; counts bind() calls."""

    def __init__(self):
        self.trainer = None

    def bind(self, trainer):
        self.trainer = trainer
        return self

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        if "eval_loss" in logs:
            logs["eval_extra"] = 3.0


class Plain(TrainerCallback):
    pass


def test_order_is_flow_ours_then_integrations_in_our_handler(tmp_path):
    fix, plain = FixLogs(), Plain()
    trainer = make_trainer(tmp_path, callbacks=[plain], report_to="tensorboard")
    stock_handler = trainer.callback_handler
    assert run_before_integrations(trainer, fix, plain) is trainer
    assert isinstance(trainer.callback_handler, CallbackHandler)
    assert trainer.callback_handler is not stock_handler
    types = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert types == [DefaultFlowCallback, FixLogs, Plain, TensorBoardCallback, PrinterCallback]
    assert fix.trainer is trainer
    # idempotent: a second call moves, never duplicates, keeps the handler
    handler = trainer.callback_handler
    run_before_integrations(trainer, fix)
    assert trainer.callback_handler is handler and trainer.callback_handler.callbacks.count(fix) == 1


def test_without_integrations_callbacks_go_last(tmp_path):
    trainer = make_trainer(tmp_path)
    run_before_integrations(trainer, FixLogs)
    assert isinstance(trainer.callback_handler.callbacks[-1], FixLogs)


def test_integration_detection():
    assert is_integration_callback(TensorBoardCallback)
    assert not is_integration_callback(DefaultFlowCallback)
    assert not is_integration_callback(FixLogs())


def test_stock_trainer_tensorboard_receives_fixed_logs(tmp_path):
    trainer = make_trainer(tmp_path, report_to="tensorboard", **EVAL_EVERY)
    run_before_integrations(trainer, FixLogs())
    trainer.train()
    scalars = read_scalars(tmp_path)
    assert scalars["eval/extra"] == {4: 3.0, 8: 3.0}
    eval_records = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert [r.get("eval_extra") for r in eval_records] == [3.0, 3.0]  # history patched too
    assert all(r["step"] in (4, 8) for r in eval_records)
    metrics = trainer.evaluate()
    assert metrics["eval_extra"] == 3.0  # same dict reaches on_evaluate and the caller


def test_trainer_plus_fixes_logs_with_callbacks_given_at_construction(tmp_path):
    fix = FixLogs()
    trainer = make_trainer(tmp_path, report_to="tensorboard", trainer_class=TrainerPlus, callbacks=[fix],
                           **EVAL_EVERY)
    assert fix.trainer is trainer
    trainer.train()
    assert read_scalars(tmp_path)["eval/extra"] == {4: 3.0, 8: 3.0}


def test_rejects_non_trainer():
    with pytest.raises(TypeError, match="callback_handler"):
        run_before_integrations(object(), FixLogs())


def test_every_trainer_with_our_handler_fires_pre_log(tmp_path):
    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

    class MyLoop(LightweightTrainer):  # defined outside hf_callbacks_plus.loop.trainer
        pass

    loop = MyLoop(LoopArguments(output_dir=str(tmp_path), disable_tqdm=True), train_step=lambda b: 1.0,
                  train_data=[[1.0]])
    handler = loop.callback_handler
    run_before_integrations(loop, FixLogs())
    assert loop.callback_handler is handler
    stock = make_trainer(tmp_path)
    assert fires_pre_log(loop) and fires_pre_log(make_trainer(tmp_path, trainer_class=TrainerPlus))
    assert not fires_pre_log(stock)
    run_before_integrations(stock)
    assert fires_pre_log(stock)


def test_callbacks_added_after_the_wiring_get_on_pre_log(tmp_path):
    trainer = make_trainer(tmp_path, **EVAL_EVERY)
    run_before_integrations(trainer, Plain())
    late = FixLogs()
    trainer.add_callback(late)  # after the bridge was installed: still gets on_pre_log
    trainer.train()
    assert [r.get("eval_extra") for r in trainer.state.log_history if "eval_loss" in r] == [3.0, 3.0]


def test_a_logger_subclass_defined_anywhere_counts_as_an_integration(tmp_path):
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger

    class MyLogger(JsonlLogger):  # a user's logger, in the user's module
        pass

    assert MyLogger.__module__ == __name__ and is_integration_callback(MyLogger)
    mine = MyLogger()
    trainer = make_trainer(tmp_path, callbacks=[mine])
    fix = FixLogs()
    run_before_integrations(trainer, fix)
    callbacks = trainer.callback_handler.callbacks
    assert callbacks.index(fix) < callbacks.index(mine)  # the fix runs before the logger sees the log


@pytest.mark.parametrize("disable_tqdm", [True, False], ids=["PrinterCallback", "ProgressCallback"])
def test_console_shows_what_on_pre_log_adds_with_report_to_none(tmp_path, capsys, disable_tqdm):
    """transformers 5's default ``report_to="none"``: the console printer/progress bar, which
    run before the user's callbacks, must print the values callbacks add in ``on_pre_log``."""
    trainer = make_trainer(tmp_path, callbacks=[FixLogs()], disable_tqdm=disable_tqdm, **EVAL_EVERY)
    run_before_integrations(trainer)
    trainer.train()
    captured = capsys.readouterr()
    console = captured.out + captured.err
    assert console.count("'eval_extra'") == 2, console


def test_train_subset_and_early_stopping_values_reach_the_console(tmp_path, capsys):
    from hf_callbacks_plus import EarlyStopping, TrainSubsetEvaluation

    trainer = make_trainer(tmp_path, callbacks=[TrainSubsetEvaluation(size=8), EarlyStopping("eval_loss")],
                           **EVAL_EVERY)
    run_before_integrations(trainer)
    trainer.train()
    printed = [line for line in capsys.readouterr().out.splitlines() if "'eval_loss'" in line]
    assert len(printed) == 2
    assert all("'train_subset_loss'" in line for line in printed), printed


@pytest.mark.parametrize("wiring", ["use_our_handler", "run_before_integrations", "TrainerPlus"])
def test_only_the_wiring_fits_the_notebook_table_use_our_handler_swaps_the_handler_alone(tmp_path, wiring):
    """``use_our_handler`` gives the trainer our handler and nothing else (it used to wrap the
    notebook table's ``on_evaluate`` as a hidden side effect); `run_before_integrations` and
    ``TrainerPlus`` fit the table, by calling ``fit_notebook_table`` themselves."""
    pytest.importorskip("IPython")  # transformers < 4.46's notebook module imports it
    from transformers.utils.notebook import NotebookProgressCallback

    from hf_callbacks_plus.integrations.notebook import _FITTED

    trainer = make_trainer(tmp_path, callbacks=[NotebookProgressCallback()],
                           trainer_class=TrainerPlus if wiring == "TrainerPlus" else None)
    {"use_our_handler": use_our_handler, "run_before_integrations": run_before_integrations}.get(
        wiring, lambda trainer: None)(trainer)
    (table,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, NotebookProgressCallback)]
    assert isinstance(trainer.callback_handler, CallbackHandler)
    assert getattr(table.on_evaluate, _FITTED, False) is (wiring != "use_our_handler")
