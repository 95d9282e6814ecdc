"""The secrets policy as two lists: what is kept (no false positives) and what is removed."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Optional

import pytest

from hf_callbacks_plus.loggers.config import collect_config
from hf_callbacks_plus.loggers.secrets import (
    MASK,
    REDACTED,
    command_line_has_secret,
    is_secret_key,
    known_secret_values,
    looks_like_secret,
    mask_secrets,
    mask_url_credentials,
    redact_config,
    redact_value,
    remember_credentials,
    unmask_url,
)

HF = "hf_" + "Q" * 34
WANDB_HEX = "0123456789abcdef0123456789abcdef01234567"  # a legacy W&B key: 40 hex digits
GIT_SHA = "34b7fe3c0e4ba1e0d7ad64e50c4e1a4dd9f6a2b1"

#: (key, value) pairs that reach the backend unchanged.
KEPT = [
    ("pad_token", "<pad>"),
    ("eos_token", "</s>"),
    ("eos_token", "<|im_end|>"),
    ("bos_token", "<s>"),
    ("unk_token", "[UNK]"),
    ("mask_token", "[MASK]"),
    ("image_token", "<image>"),
    ("pad_token", "<|endoftext|>"),
    ("eos_token", "<eos>"),
    ("chat_token", "<|assistant|>"),  # any *_token with a vocabulary token's shape
    ("pad_token_id", "0"),
    ("num_tokens", "123"),
    ("include_num_input_tokens_seen", "True"),
    ("commit", GIT_SHA),
    ("git_sha", GIT_SHA),
    ("revision", GIT_SHA),
    ("model.revision", GIT_SHA[:7]),
    ("tracking_uri", "http://mlflow.example:5000"),
    ("url", "https://huggingface.co/api/models?search=bert&limit=5"),
    ("author", "alice"),
    ("hub_model_id", "alice/tiny-bert"),
    ("run_name", "lr-0.1_seed-3"),
    ("note", "a plain sentence with an @ sign: me@example.com"),
    ("use_auth_token", "False"),
    ("hub_token", "None"),
]

#: (key, value, text that must not survive) triples.
REMOVED = [
    ("hub_token", HF, HF),
    ("hf_token", "abc-not-shaped-like-a-token", "abc-not-shaped-like-a-token"),
    ("WANDB_API_KEY", WANDB_HEX, WANDB_HEX),
    ("api_key", WANDB_HEX, WANDB_HEX),
    ("db_password", "hunter2hunter2", "hunter2hunter2"),
    ("password", "p", "p"),
    ("client_secret", "s3cr3t-value", "s3cr3t-value"),
    ("aws_access_key", "AKIAxxxxxxxx", "AKIAxxxxxxxx"),
    ("MLFLOW_TRACKING_TOKEN", "dapi" + "0" * 32, "dapi" + "0" * 32),
    ("note", HF, HF),  # an access token under any key
    ("note", "token is wandb_v1_" + "Z" * 40, "wandb_v1_" + "Z" * 40),
    ("comment", "see github_pat_" + "G" * 50, "github_pat_" + "G" * 50),
    ("tracking_uri", "http://alice:S3cretPW@mlflow.example:5000", "S3cretPW"),
    ("run_name", "exp https://bob:PW4run@host/x", "PW4run"),
    ("hub_model_id", "https://carol:PW4hub@hub.example/org/model", "PW4hub"),
    ("repo", f"https://{HF}@huggingface.co/org/model", HF),
    ("url", "https://host/api?x=1&access_token=Tok3nValue&y=2", "Tok3nValue"),
    ("eos_token", HF, HF),  # a vocabulary field holding an access token is still a secret
    ("hub_token", "<HUB_TOKEN>", "<HUB_TOKEN>"),  # transformers' placeholder of a set token
]


@pytest.mark.parametrize(("key", "value"), KEPT)
def test_kept(key, value, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", WANDB_HEX)
    assert redact_value(key, value) == value
    assert not looks_like_secret(key, value)
    assert mask_secrets(value) == value


@pytest.mark.parametrize(("key", "value", "secret"), REMOVED)
def test_removed(key, value, secret):
    out = redact_value(key, value)
    assert secret not in out
    assert out == REDACTED or MASK in out


@pytest.mark.parametrize("key", ["pad_token", "eos_token", "bos_token", "image_token", "pad_token_id",
                                 "num_tokens", "max_length", "tokenizer_name"])
def test_vocabulary_and_counter_keys_are_not_secret_keys(key):
    assert not is_secret_key(key)


def test_secret_env_values_are_masked_anywhere_and_git_shas_are_not(monkeypatch):
    """A 40-hex W&B key cannot be told from a git SHA by its shape: the process's own secret
    environment values are masked, every other hex digest is kept."""
    monkeypatch.setenv("WANDB_API_KEY", WANDB_HEX)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "mlflow-pass-123")
    assert redact_value("note", WANDB_HEX) == REDACTED
    assert redact_value("commit", GIT_SHA) == GIT_SHA
    text = f"key={WANDB_HEX} sha={GIT_SHA} pw=mlflow-pass-123"
    assert mask_secrets(text) == f"key={MASK} sha={GIT_SHA} pw={MASK}"
    monkeypatch.delenv("WANDB_API_KEY")
    assert redact_value("note", WANDB_HEX) == WANDB_HEX  # not a known secret: a digest like any other


def test_url_masking():
    assert mask_url_credentials("http://alice:pw@host:5000/x") == "http://alice:***@host:5000/x"
    assert mask_url_credentials("postgresql+psycopg2://u:p%40ss@db/mlflow") == "postgresql+psycopg2://u:***@db/mlflow"
    assert mask_url_credentials("ssh://git@github.com/org/repo") == "ssh://git@github.com/org/repo"
    assert mask_url_credentials(f"https://{HF}@huggingface.co") == "https://***@huggingface.co"
    assert mask_url_credentials("sqlite:///tmp/mlflow.db") == "sqlite:///tmp/mlflow.db"
    assert mask_url_credentials("uri http://a:b@h and http://c:d@k") == "uri http://a:***@h and http://c:***@k"
    masked = mask_url_credentials("http://alice:pw@host")
    assert mask_url_credentials(masked) == masked  # stable
    assert mask_url_credentials("http://host") == "http://host"
    assert mask_url_credentials(None) is None and mask_url_credentials(3) == 3


def test_masked_url_comes_back_only_when_known(monkeypatch):
    real = "http://dave:RealPW@tracking.example:5000"
    masked = remember_credentials(real)
    assert masked == "http://dave:***@tracking.example:5000"
    assert unmask_url(masked) == real
    monkeypatch.setenv("MY_URI", "http://erin:EnvPW@other.example")
    assert unmask_url("http://erin:***@other.example", "MY_URI") == "http://erin:EnvPW@other.example"
    with pytest.raises(ValueError, match="masked credentials.*MY_URI"):
        unmask_url("http://frank:***@unknown.example", "MY_URI")
    assert unmask_url("http://plain.example") == "http://plain.example"


def test_command_line(monkeypatch):
    assert command_line_has_secret(["--hub_token", "x"]) and command_line_has_secret(["--api-key=x"])
    assert command_line_has_secret(["--tracking_uri", "http://u:pw@host"])
    assert command_line_has_secret(["run", HF])
    assert not command_line_has_secret(["--pad_token", "<pad>", "--eos_token", "</s>"])
    assert not command_line_has_secret(["--revision", GIT_SHA, "--output_dir", "out"])
    monkeypatch.setenv("HF_TOKEN", "plainhftokenvalue")
    assert command_line_has_secret(["--whatever", "plainhftokenvalue"])


def test_redact_config_on_a_trl_style_config(tmp_path):
    """``TrainingArguments.to_dict()`` replaces every ``*_token`` field by a placeholder: the
    vocabulary-token fields of a trl-style config (``SFTConfig.pad_token``/``eos_token``) get
    their value back, ``hub_token`` stays removed."""
    from transformers import TrainingArguments

    @dataclasses.dataclass
    class SFTStyleConfig(TrainingArguments):
        pad_token: Optional[str] = None
        eos_token: Optional[str] = None

    args = SFTStyleConfig(output_dir=str(tmp_path), pad_token="<|pad|>", eos_token="<|im_end|>", hub_token=HF,
                          run_name="http://alice:RunPW@host/run", report_to="none", use_cpu=True)
    params = collect_config(args)
    assert params["pad_token"] == "<|pad|>" and params["eos_token"] == "<|im_end|>"
    assert params["hub_token"] == REDACTED
    assert params["run_name"] == "http://alice:***@host/run"
    assert not any(HF in value or "RunPW" in value for value in params.values())


def test_redact_config_keeps_lists_readable():
    out = redact_config({"special": ["<s>", HF], "lr": 0.1})
    assert out == {"special": f"['<s>', '{MASK}']", "lr": "0.1"}


def test_console_lines_are_masked(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        logging.getLogger("hf_callbacks_plus").warning("cannot reach %s", "http://gina:ConsolePW@host:1")
    assert "ConsolePW" not in caplog.text and "http://gina:***@host:1" in caplog.text


@pytest.mark.mlflow
def test_mlflow_logger_keeps_the_uri_password_out_of_its_state_and_log(tmp_path):
    pytest.importorskip("mlflow")
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    real = "http://henry:StatePW@127.0.0.1:9/"
    logger = MLflowLogger(tracking_uri=real, wal_dir=str(tmp_path))
    assert logger.tracking_uri == real
    assert "StatePW" not in logger.state_key and "StatePW" not in json.dumps(logger.backend.target("k"))
    assert "StatePW" not in repr(logger.state())
    rebuilt = MLflowLogger(**logger.state()["args"])  # what restore_callback_states_from_checkpoint does
    assert rebuilt.tracking_uri == real and rebuilt.state_key == logger.state_key


class EnvironmentChangedDuringIteration(dict):
    """Fault injection: an environment whose first ``items()`` raises ``KeyError``, as ``os.environ``
    does when another thread removes a variable while it is read (mlflow's telemetry thread does)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0

    def items(self):
        self.reads += 1
        if self.reads == 1:
            raise KeyError("_MLFLOW_TELEMETRY_SESSION_ID")
        return super().items()


def test_secret_env_values_are_read_again_when_another_thread_changes_the_environment():
    environ = EnvironmentChangedDuringIteration(HF_TOKEN="hf_" + "T" * 34)
    assert known_secret_values(environ) == ["hf_" + "T" * 34]
    text = "token " + "hf_" + "T" * 34
    assert mask_secrets(text, environ=EnvironmentChangedDuringIteration()) == "token ***"
