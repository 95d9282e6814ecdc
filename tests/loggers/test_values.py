"""Rendering a record: values, secrets, names the tracker accepts, repeats and the resume boundary
(no backend: the renderer of a logger)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from hf_callbacks_plus.loggers.base import Renderer, normalize_value
from hf_callbacks_plus.loggers.config import collect_config
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from hf_callbacks_plus.loggers.mlflow import MLflowLogger, clean_mlflow_name
from hf_callbacks_plus.loggers.secrets import REDACTED, is_secret_key, redact_config
from tests.tiny_models import training_args


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, ("number", 1.0)),
        (False, ("number", 0.0)),
        (3, ("number", 3.0)),
        (np.float32(0.5), ("number", 0.5)),
        (np.int64(7), ("number", 7.0)),
        (np.bool_(True), ("number", 1.0)),
        (torch.tensor(2.5), ("number", 2.5)),
        (torch.tensor([4.0]), ("number", 4.0)),
        ("patience", ("text", "patience")),
    ],
)
def test_normalize_numbers_and_text(value, expected):
    assert normalize_value(value) == expected


@pytest.mark.parametrize("value", [None, [1, 2], torch.tensor([1.0, 2.0]), {"a": 1}, np.zeros(3)])
def test_normalize_drops_non_scalars(value):
    assert normalize_value(value)[0] == "drop"


def test_nan_is_kept_as_a_number():
    kind, number = normalize_value(float("nan"))
    assert kind == "number" and math.isnan(number)


@pytest.mark.parametrize("key", ["hub_token", "args.hub_token", "WANDB_API_KEY", "apiKey", "db_password",
                                 "client_secret", "use_auth_token", "aws_access_key", "push_to_hub_token"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["pad_token_id", "bos_token_id", "include_num_input_tokens_seen",
                                 "max_tokens", "tokenizer_name", "learning_rate", "author"])
def test_not_secret_keys(key):
    assert not is_secret_key(key)


def test_redact_by_key_and_by_value():
    out = redact_config({"hub_token": "abc", "note": "hf_" + "a" * 30, "lr": 0.1, "api_key": None})
    assert out == {"hub_token": REDACTED, "note": REDACTED, "lr": "0.1", "api_key": "None"}


def test_collect_config_redacts_training_arguments_and_model_config(tmp_path):
    class Model:
        class config:  # noqa: N801 - mimics a PretrainedConfig
            @staticmethod
            def to_dict():
                return {"hidden": 4, "nested": {"secret": "s3cr3t", "depth": 2}, "pad_token_id": 0}

    args = training_args(tmp_path, hub_token="hf_" + "x" * 34)
    params = collect_config(args, Model())
    assert params["hub_token"] == REDACTED
    assert params["model.nested.secret"] == REDACTED
    assert params["model.nested.depth"] == "2" and params["model.pad_token_id"] == "0"
    assert not any("x" * 34 in value or "s3cr3t" in value for value in params.values())


def test_a_nested_config_is_logged_flat():
    assert collect_config({"a": {"b": {"c": 1}}, "d": [1]}) == {"a.b.c": "1", "d": "[1]"}


def test_a_name_collision_gets_a_suffix_and_one_warning(caplog):
    pytest.importorskip("mlflow")
    renderer = Renderer(MLflowLogger(tracking_uri="sqlite:///unused.db"))
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        assert renderer.name("eval/f1@k") == "eval/f1_k"
        assert renderer.name("eval/f1#k") == "eval/f1_k_2"
        assert renderer.name("eval/f1#k") == "eval/f1_k_2"
    assert len([r for r in caplog.records if "both become" in r.message]) == 1


def test_mlflow_clean_name_removes_empty_and_dot_parts():
    assert clean_mlflow_name("train/<empty>") == "train/_empty_"
    assert clean_mlflow_name("/a//./b/") == "a/_/b"


def test_a_token_shaped_metric_name_is_masked(monkeypatch):
    """The secrets policy applies to names too: a key holding a token (or a secret environment
    value) reaches no tracker. (Before, only values were masked.)"""
    monkeypatch.setenv("MY_API_KEY", "k" * 20)
    record = Renderer(JsonlLogger()).render({f"loss_{'hf_' + 'N' * 34}": 1.0, f"x_{'k' * 20}": 2.0}, 3, 0)
    assert record.metrics == {"train/loss_***": 1.0, "train/x_***": 2.0}


def test_repeats_and_the_resume_boundary_are_left_out_and_a_second_value_at_one_step_is_kept():
    renderer = Renderer(JsonlLogger())
    renderer.held = {"train/loss": 4}
    assert renderer.render({"loss": 1.0}, 4, 0) is None  # the run held step 4 before this session
    record = renderer.render({"loss": 1.0, "epoch": 1.0}, 5, 0)
    assert record.metrics == {"train/loss": 1.0, "train/epoch": 1.0}
    assert renderer.render({"epoch": 1.0}, 5, 0) is None  # an exact repeat (the end-of-training epoch)
    assert renderer.render({"loss": 0.5}, 5, 0).metrics == {"train/loss": 0.5}  # a second value: kept
    assert renderer.last_steps == {"train/loss": 5, "train/epoch": 5}


def test_texts_go_to_the_summary_secret_ones_redacted_and_odd_values_are_dropped_once(caplog):
    renderer = Renderer(JsonlLogger())
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        for step in (1, 2):
            record = renderer.render({"loss": 1.0, "note": "at https://u:pw@host", "hub_token": "abc",
                                      "vector": [1, 2], "huge": 10**400}, step, 0)
    assert record.summary == {"train/note": "at https://u:***@host", "train/hub_token": REDACTED}
    assert record.metrics == {"train/loss": 1.0}
    assert len([r for r in caplog.records if "'train/vector'" in r.message]) == 1
    assert len([r for r in caplog.records if "too large" in r.message]) == 1
