"""Secrets: what must never leave the process, and how every text and name is masked (docs/secrets.md)."""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Optional

__all__ = ["MASK", "REDACTED", "command_line_has_secret", "install_log_filter", "is_secret_key",
           "is_vocabulary_token", "known_secret_values", "looks_like_secret", "mask_log_record",
           "mask_secrets", "mask_url_credentials", "redact_config", "redact_value", "remember_credentials",
           "unmask_url"]

#: What a whole secret value is replaced with before it reaches a backend.
REDACTED = "<redacted>"
#: What a password inside a URL (or a token inside a text) is replaced with.
MASK = "***"

# A key "names a secret" when one of its words (split on "_", "-", "." and camelCase) is one of these.
_SECRET_WORDS = re.compile(r"(?:^|_)(token|secret|secrets|password|passwd|pwd|apikey|api_key|access_key|"
                           r"private_key|credential|credentials|auth)(?:_|$)")
_NOT_SECRET_SUFFIXES = ("_id", "_ids", "_type", "_length", "_len", "_index", "_idx")
# ``<role>_token`` fields of tokenizers, processors and trl configs hold vocabulary tokens.
_VOCABULARY_ROLES = re.compile(
    r"(?:^|_)(pad|eos|bos|unk|sep|cls|mask|image|video|audio|boi|eoi|boa|eoa|im_start|im_end|eot|eom|"
    r"fim_prefix|fim_middle|fim_suffix|think|end_think|decoder_start|sentinel|additional_special|"
    r"start_of_turn|end_of_turn|start_of_image|end_of_image)_token$")
# The shape of a vocabulary token: ``<pad>``, ``</s>``, ``[PAD]``, ``<|im_end|>``, ``▁``...
_VOCABULARY_VALUE = re.compile(r"^(<\|?[^<>\s]{0,40}\|?>|\[[A-Za-z_]{1,20}\]|[^\w\s]{1,4})$")
# Access tokens recognizable by their shape, matched anywhere in a string.
_TOKEN_PATTERNS = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}|wandb_v1_[A-Za-z0-9_]{20,}"
    r"|dapi[0-9a-f]{32}(?:-\d+)?|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,}"
    r"|sk-(?:proj-)?[A-Za-z0-9_-]{32,})(?![A-Za-z0-9])")
# ``scheme://userinfo@`` inside any text: the userinfo (``user:password`` or a lone token).
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/@?#'\"<>]+)@")
# ``?name=value`` / ``&name=value`` query parameters (values masked when the name is a secret).
_QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&#\s'\"<>]*)")
# Values that say "not set" (a credential field holding them holds no credential).
_NOT_SET = frozenset({"", "None", "none", "null", "False", "false", "True", "true"})
# Secret environment variables shorter than this are not searched for (``1``, ``true``...).
_MIN_ENV_SECRET = 8
# Shell variables whose names read as secrets ("pwd") but hold the working directory.
_NOT_SECRET_ENV = frozenset({"PWD", "OLDPWD"})


@functools.lru_cache(maxsize=8192)
def is_secret_key(key: str) -> bool:
    """Tell whether a key (its last dotted part) names a credential: ``hub_token``, ``WANDB_API_KEY``,
    ``db_password``; not ``pad_token_id``, ``num_tokens`` or vocabulary fields (``eos_token``)."""
    last = _last_word(key)
    if last.endswith(_NOT_SECRET_SUFFIXES) or _VOCABULARY_ROLES.search(last):
        return False
    return bool(_SECRET_WORDS.search(last))


def _last_word(key: Any) -> str:
    last = re.split(r"[./]", str(key))[-1]
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower().replace("-", "_")


def is_vocabulary_token(key: str, value: Any) -> bool:
    """True when ``key``/``value`` is a tokenizer's vocabulary token (``eos_token``: ``<|im_end|>``) by
    its role name or its shape (``<pad>``, ``[PAD]``), unless the value is shaped like an access token."""
    if not isinstance(value, str):
        return False
    last = _last_word(key)
    if _TOKEN_PATTERNS.search(value) or value == f"<{last.upper()}>":  # a token, or transformers' mask
        return False
    return bool(_VOCABULARY_ROLES.search(last) or _VOCABULARY_VALUE.match(value.strip()))


def known_secret_values(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The values (8 characters or more) of the environment variables naming a secret
    (``WANDB_API_KEY``, ``HF_TOKEN``...), longest first. ``environ`` defaults to ``os.environ``."""
    values = {value for name, value in _items(os.environ if environ is None else environ)
              if len(value) >= _MIN_ENV_SECRET and name not in _NOT_SECRET_ENV and is_secret_key(name)}
    return sorted(values, key=len, reverse=True)


def _items(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``environ.items()``, read again when another thread changed it meanwhile (mlflow's threads do)."""
    for _ in range(10):
        try:
            return list(environ.items())
        except (KeyError, RuntimeError):
            continue
    return []


def _mask_userinfo(match: re.Match) -> str:
    user, colon, password = match.group("userinfo").partition(":")
    if _TOKEN_PATTERNS.search(user) or (not password and len(user) >= 20):  # a token as the user name
        user = MASK
    return f"{match.group('scheme')}{user}{colon}{MASK if password else ''}@"


def _mask_query(match: re.Match) -> str:
    if match.group("value") and is_secret_key(match.group("name").replace(".", "_")):
        return f"{match.group('sep')}{match.group('name')}={MASK}"
    return match.group(0)


def mask_url_credentials(text: Any) -> Any:
    """Mask the credentials of every URL inside ``text`` (a password, a token as the user, a query
    parameter naming a secret); masking twice changes nothing; non-strings are returned as they are."""
    if not isinstance(text, str) or ("@" not in text and "=" not in text):
        return text
    masked = _URL_USERINFO.sub(_mask_userinfo, text)
    if "://" in masked or masked.startswith("?"):
        masked = _QUERY_PARAM.sub(_mask_query, masked)
    return masked


def mask_secrets(text: Any, environ: Optional[Mapping[str, str]] = None) -> Any:
    """Mask every secret inside ``text`` (URL credentials, access tokens, values of secret environment
    variables of ``environ``, default ``os.environ``), keeping the rest of the text."""
    if not isinstance(text, str) or not text:
        return text
    masked = mask_url_credentials(text)
    masked = _TOKEN_PATTERNS.sub(MASK, masked)
    for secret in known_secret_values(environ):
        masked = masked.replace(secret, MASK)
    return masked


def looks_like_secret(key: str, value: Any) -> bool:
    """True when a string ``value`` logged under ``key`` must be replaced as a whole: the key names a
    credential (not a vocabulary token), or the value is an access token or a secret env value."""
    stripped = value.strip() if isinstance(value, str) else ""
    if stripped in _NOT_SET:
        return False
    return ((is_secret_key(key) and not is_vocabulary_token(key, value))
            or bool(_TOKEN_PATTERNS.fullmatch(stripped)) or stripped in known_secret_values())


def redact_value(key: str, value: Any) -> str:
    """The text a tracker receives for the config value ``value`` of ``key``: ``<redacted>`` for a
    set credential field or a secret value, else ``str(value)`` with secrets masked."""
    text = value if isinstance(value, str) else str(value)
    if value is None or isinstance(value, bool):
        return text
    return REDACTED if looks_like_secret(key, text) else mask_secrets(text)


def redact_config(config: Mapping[str, Any]) -> dict[str, str]:
    """A flat config as strings with every secret removed (`redact_value`); keys are masked too."""
    return {mask_secrets(key): redact_value(key, value) for key, value in config.items()}


def command_line_has_secret(argv: list[str]) -> bool:
    """True when a command line passes a secret: ``--hub_token X``, ``--api-key=X``, a URL with a
    password, an access token, or the value of a secret environment variable."""
    for index, arg in enumerate(argv):
        if mask_secrets(arg) != arg:  # a URL's credentials, an access token, a secret env value
            return True
        if arg.startswith("-"):
            flag, _, inline = arg.lstrip("-").partition("=")
            if is_secret_key(flag.replace("-", "_")):
                value = inline if inline else (argv[index + 1] if index + 1 < len(argv) else "")
                if value and not value.startswith("-") and not is_vocabulary_token(flag, value):
                    return True
    return False


_MASKED_PART = re.compile(r"://[^\s/@]*\*\*\*[^\s/@]*@|[?&;][A-Za-z0-9_.\-]+=\*\*\*")
# Masked URI -> the real one, for every URI with credentials a logger was given in this process.
_UNMASKED: dict[str, str] = {}


def remember_credentials(url: Any) -> Any:
    """``url`` with its credentials masked; `unmask_url` gives the real one back in this process."""
    masked = mask_url_credentials(url)
    if masked != url:
        _UNMASKED[masked] = url
    return masked


def unmask_url(url: Any, env_var: Optional[str] = None) -> Any:
    """The real URL behind a masked one (given earlier in this process, or ``env_var``'s value);
    ``url`` itself when nothing in it is masked.

    Raises:
        ValueError: ``url`` has masked credentials and the real URL is unknown.
    """
    if not isinstance(url, str) or not _MASKED_PART.search(url):
        return url
    if url in _UNMASKED:
        return _UNMASKED[url]
    candidate = os.environ.get(env_var) if env_var else None
    if candidate and mask_url_credentials(candidate) == url:
        return candidate
    hint = f" or set {env_var}" if env_var else ""
    raise ValueError(f"The URL {url!r} has masked credentials (checkpoints never hold them) and the real URL "
                     f"is not known in this process; pass it explicitly{hint}.")


def mask_log_record(record: logging.LogRecord) -> bool:
    """A logging filter: rewrite ``record`` with its secrets masked (`mask_secrets`); never drops it."""
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: let logging report it as usual
        return True
    masked = mask_secrets(message)
    if masked != message:
        record.msg, record.args = masked, ()
    return True


def install_log_filter(name: str = "hf_callbacks_plus") -> None:
    """Attach `mask_log_record` to the logger ``name`` once."""
    target = logging.getLogger(name)
    if mask_log_record not in target.filters:
        target.addFilter(mask_log_record)


install_log_filter()
