"""Value normalization, secret redaction, name sanitizing (pure functions, no backend)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from hf_callbacks_plus.loggers.mlflow import MLflowLogger
from hf_callbacks_plus.loggers.records import NameSanitizer, collect_config, flatten_config, normalize_value
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


def test_flatten_config():
    assert flatten_config({"a": {"b": {"c": 1}}, "d": [1]}) == {"a.b.c": 1, "d": [1]}


def test_sanitizer_collision_gets_a_suffix_and_one_warning(caplog):
    sanitize = NameSanitizer(MLflowLogger.clean_name)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        assert sanitize("eval/f1@k") == "eval/f1_k"
        assert sanitize("eval/f1#k") == "eval/f1_k_2"
        assert sanitize("eval/f1#k") == "eval/f1_k_2"
    assert len([r for r in caplog.records if "both become" in r.message]) == 1


def test_mlflow_clean_name_removes_empty_and_dot_parts():
    assert MLflowLogger.clean_name("train/<empty>") == "train/_empty_"
    assert MLflowLogger.clean_name("/a//./b/") == "a/_/b"
