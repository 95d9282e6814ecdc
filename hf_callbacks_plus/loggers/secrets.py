"""Secrets: which config keys, logged strings and command lines carry credentials, and redaction.

One concern in one module: every logger redacts through these functions before anything
reaches a backend (config params, text values, W&B metadata).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "command_line_has_secret", "is_secret_key", "looks_like_secret", "redact_config"]

#: What a secret value is replaced with before it reaches a backend.
REDACTED = "<redacted>"

# A key "names a secret" when one of its words (split on "_", "-", "." and camelCase) is one of
# these; ``*_token_id(s)`` (tokenizer ids) and counters such as ``num_tokens`` are not secrets.
_SECRET_WORDS = re.compile(
    r"(?:^|_)(token|secret|secrets|password|passwd|pwd|apikey|api_key|access_key|private_key|"
    r"credential|credentials|auth)(?:_|$)"
)
_NOT_SECRET_SUFFIXES = ("_id", "_ids", "_type", "_length", "_len")
# Values that look like secrets whatever their key (Hugging Face and W&B style tokens).
_SECRET_VALUE = re.compile(r"^(hf_[A-Za-z0-9]{20,}|[0-9a-f]{40})$")


def is_secret_key(key: str) -> bool:
    """Tell whether a config key names a secret (token, secret, password, api key...).

    Args:
        key: A config key, possibly dotted (``"args.hub_token"``); only the last part counts.

    Returns:
        True for ``hub_token``, ``api_key``, ``WANDB_API_KEY``, ``db_password``...; False for
        ``pad_token_id`` or ``include_num_input_tokens_seen``.
    """
    last = re.split(r"[./]", key)[-1]
    last = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower().replace("-", "_")
    if last.endswith(_NOT_SECRET_SUFFIXES):
        return False
    return bool(_SECRET_WORDS.search(last))


def looks_like_secret(key: str, value: Any) -> bool:
    """True when a string ``value`` must not reach a backend: its key names a secret
    (`is_secret_key`) or the value looks like an access token (``hf_...``, 40 hex digits).

    Example:
        >>> looks_like_secret("train/hub_token", "hf_x"), looks_like_secret("train/note", "hello")
        (True, False)
    """
    if not isinstance(value, str) or value == "":
        return False
    return is_secret_key(key) or bool(_SECRET_VALUE.match(value.strip()))


def command_line_has_secret(argv: list[str]) -> bool:
    """True when a command line passes a secret: ``--hub_token X``, ``--api-key=X``, or a value
    that looks like an access token.

    Example:
        >>> command_line_has_secret(["--hub_token", "hf_x"]), command_line_has_secret(["--lr", "0.1"])
        (True, False)
    """
    for index, arg in enumerate(argv):
        if _SECRET_VALUE.match(arg.strip()):
            return True
        if arg.startswith("-"):
            flag, _, inline = arg.lstrip("-").partition("=")
            if is_secret_key(flag.replace("-", "_")):
                value = inline if inline else (argv[index + 1] if index + 1 < len(argv) else "")
                if value and not value.startswith("-"):
                    return True
    return False


def redact_config(config: Mapping[str, Any]) -> dict[str, str]:
    """Turn a flat config into strings, replacing every secret with ``<redacted>``.

    A value is redacted when its key names a secret (`is_secret_key`) or when the value
    itself looks like an access token (``hf_...``, 40 hex digits). Nested containers are turned
    into their ``repr``; a secret nested inside a list is caught by the value pattern only, so
    keep secrets in top-level fields.
    """
    out: dict[str, str] = {}
    for key, value in config.items():
        text = value if isinstance(value, str) else str(value)
        if is_secret_key(key) and value not in (None, "", False):
            text = REDACTED
        elif isinstance(value, str) and _SECRET_VALUE.match(value.strip()):
            text = REDACTED
        out[key] = text
    return out
