"""LoopArguments: TrainingArguments' defaults and validation rules, with clear errors."""

from __future__ import annotations

import enum

import pytest

from hf_callbacks_plus.loop import LoopArguments


class Strategy(enum.Enum):
    """Stands in for transformers' IntervalStrategy: an enum compared by ``.value``."""

    STEPS = "steps"
    EPOCH = "epoch"


def test_defaults_match_training_arguments():
    args = LoopArguments()
    assert (args.num_train_epochs, args.max_steps, args.logging_steps, args.save_steps) == (3.0, -1, 500, 500)
    assert (args.logging_strategy, args.eval_strategy, args.save_strategy) == ("steps", "no", "steps")
    assert args.eval_steps is None and args.metric_for_best_model is None and args.report_to == []


def test_eval_steps_default_to_logging_steps():
    assert LoopArguments(eval_strategy="steps", logging_steps=7).eval_steps == 7


def test_enum_strategies_are_accepted_by_value():
    args = LoopArguments(eval_strategy=Strategy.EPOCH, logging_strategy=Strategy.STEPS)
    assert args.eval_strategy == "epoch" and args.logging_strategy == "steps"


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"eval_strategy": "sometimes"}, ["eval_strategy='sometimes'", "'no', 'steps', 'epoch'"]),
        ({"save_strategy": "always"}, ["save_strategy='always'", "'best'"]),
        ({"logging_steps": 2.5}, ["logging_steps=2.5", "integer"]),
        ({"save_steps": -1}, ["save_steps=-1", "negative"]),
        ({"logging_steps": 0}, ["logging_steps", "non-zero"]),
        ({"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps", "0", ">= 1"]),
        ({"save_strategy": "best"}, ["save_strategy='best'", "metric_for_best_model"]),
        (
            {"include_num_input_tokens_seen": "some"},
            ["include_num_input_tokens_seen='some'", "'non_padding'"],
        ),
        ({"report_to": "wandb"}, ["report_to='wandb'", "callbacks"]),
        (
            {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "epoch"},
            ["eval_strategy='steps'", "save_strategy='epoch'"],
        ),
        (
            {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 3, "save_steps": 5},
            ["save_steps=5", "eval_steps=3", "multiple"],
        ),
        (
            {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 0.1, "save_steps": 5},
            ["fraction", "save_steps=5"],
        ),
    ],
)
def test_invalid_values_are_named_in_the_error(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        LoopArguments(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("kwargs", [{"max_steps": 2.0}, {"logging_steps": "10"}, {"save_total_limit": 1.5}])
def test_wrong_types_raise_type_error(kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        LoopArguments(**kwargs)


def test_best_model_defaults():
    args = LoopArguments(load_best_model_at_end=True, eval_strategy="steps", eval_steps=5, save_steps=10)
    assert args.metric_for_best_model == "loss" and args.greater_is_better is False
    assert LoopArguments(metric_for_best_model="accuracy").greater_is_better is True
    fractions = LoopArguments(
        load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.3
    )
    assert fractions.save_steps == 0.3


def test_save_best_needs_no_matching_strategies():
    args = LoopArguments(
        save_strategy="best", metric_for_best_model="f1", load_best_model_at_end=True, eval_strategy="epoch"
    )
    assert args.greater_is_better is True


def test_bool_token_counting_and_dict_views():
    args = LoopArguments(include_num_input_tokens_seen=True, output_dir="~/runs")
    assert args.include_num_input_tokens_seen == "all"
    assert not args.output_dir.startswith("~")
    assert args.to_dict()["eval_strategy"] == "no"
    assert args.to_sanitized_dict()["eval_steps"] == "None"
    assert '"logging_steps": 500' in args.to_json_string()
    assert (args.world_size, args.process_index, args.should_save) == (1, 0, True)


def test_from_training_arguments_copies_same_named_fields():
    class Like:  # any object with TrainingArguments' attribute names
        eval_strategy = Strategy.STEPS
        eval_steps = 4
        logging_steps = 2
        max_steps = 9
        report_to = ["wandb"]

    args = LoopArguments.from_training_arguments(Like(), save_strategy="no")
    assert (args.eval_strategy, args.eval_steps, args.max_steps, args.report_to) == ("steps", 4, 9, [])
    assert args.save_strategy == "no"


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("kwargs", "error", "fragments"),
    [
        ({"logging_steps": NAN}, ValueError, ["logging_steps=nan", "finite", "int >= 1", "(0, 1)"]),
        ({"save_steps": INF}, ValueError, ["save_steps=inf", "finite"]),
        ({"eval_strategy": "steps", "eval_steps": NAN}, ValueError, ["eval_steps=nan", "finite"]),
        ({"num_train_epochs": NAN}, ValueError, ["num_train_epochs=nan", "finite number >= 0"]),
        ({"num_train_epochs": -INF}, ValueError, ["num_train_epochs=-inf", "finite number >= 0"]),
        ({"num_train_epochs": "3"}, TypeError, ["num_train_epochs='3'", "number", "str"]),
        ({"learning_rate": INF}, ValueError, ["learning_rate=inf", "finite"]),
        ({"eval_delay": NAN}, ValueError, ["eval_delay=nan", "finite"]),
        ({"eval_delay": -1}, ValueError, ["eval_delay=-1", ">= 0"]),
        ({"eval_delay": "5"}, TypeError, ["eval_delay='5'", "number"]),
        ({"metric_for_best_model": NAN}, TypeError, ["metric_for_best_model=nan", "'accuracy'", "float"]),
        ({"metric_for_best_model": 3}, TypeError, ["metric_for_best_model=3", "string", "int"]),
        ({"metric_for_best_model": ["loss"]}, TypeError, ["metric_for_best_model=['loss']", "list"]),
        ({"metric_for_best_model": "  "}, ValueError, ["metric_for_best_model='  '", "empty"]),
        ({"greater_is_better": "False"}, TypeError, ["greater_is_better='False'", "True, False or None"]),
        ({"load_best_model_at_end": "yes"}, TypeError, ["load_best_model_at_end='yes'", "True or False"]),
        ({"logging_first_step": 1}, TypeError, ["logging_first_step=1", "True or False", "int"]),
        ({"disable_tqdm": "no"}, TypeError, ["disable_tqdm='no'", "True, False or None"]),
        ({"per_device_train_batch_size": 0}, ValueError, ["per_device_train_batch_size=0", ">= 1"]),
        ({"per_device_eval_batch_size": 2.5}, TypeError, ["per_device_eval_batch_size=2.5", "int >= 1"]),
        ({"max_steps": NAN}, TypeError, ["max_steps=nan", "an int"]),
        ({"save_total_limit": INF}, TypeError, ["save_total_limit=inf", "None or an int"]),
        ({"output_dir": 42}, TypeError, ["output_dir=42", "string or a path"]),
        ({"run_name": 7}, TypeError, ["run_name=7", "None or a string"]),
        ({"resume_from_checkpoint": True}, TypeError, ["resume_from_checkpoint=True", "train("]),
    ],
)
def test_misuse_is_refused_naming_argument_value_and_choices(kwargs, error, fragments):
    with pytest.raises(error) as info:
        LoopArguments(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_numpy_numbers_and_paths_are_accepted():
    np = pytest.importorskip("numpy")
    from pathlib import Path

    args = LoopArguments(max_steps=np.int64(5), num_train_epochs=np.float32(2.0),
                         save_total_limit=np.int32(2), output_dir=Path("runs") / "x",
                         resume_from_checkpoint=Path("runs/x/checkpoint-2"))
    assert (args.max_steps, args.save_total_limit) == (5, 2) and type(args.max_steps) is int
    assert args.output_dir == str(Path("runs") / "x") and args.resume_from_checkpoint.endswith("checkpoint-2")
