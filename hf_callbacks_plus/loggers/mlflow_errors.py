"""What an MLflow call's error means: worth retrying, and its cause in words (standard library only:
the helper process of `mlflow_helper` classifies its own errors with it, without importing the package)."""

from __future__ import annotations

import re
import socket
import sqlite3
import ssl
from typing import Optional
from urllib.parse import urlparse

__all__ = ["StoreCallFailed", "explain_mlflow_error", "is_transient_mlflow_error"]

#: MLflow error codes of a store that may answer later (the request itself was fine).
_TRANSIENT_ERROR_CODES = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "INTERNAL_ERROR",
                                    "DEADLINE_EXCEEDED"})
#: What an MLflow error message shows of an HTTP 5xx/429 answer or of retries given up.
_TRANSIENT_MESSAGE = re.compile(
    r"max retries exceeded|too many \d{3} error responses|error code (5\d\d|429)\b|"
    r"\b(5\d\d|429) (server error|too many requests)|database is locked", re.IGNORECASE)


class StoreCallFailed(Exception):
    """An MLflow call that failed in the helper process, as the helper classified it there (an exception
    loses its cause and error code when pickled).

    Args:
        cause: `explain_mlflow_error`'s words.
        transient: `is_transient_mlflow_error`'s verdict.
        kind: `explain_mlflow_error`'s kind.
    """

    message_is_cause = True

    def __init__(self, cause: str, transient: bool, kind: Optional[str]) -> None:
        super().__init__(cause)
        self.transient, self.kind = transient, kind


def _network_error_types() -> tuple[type, ...]:
    import requests  # both installed with mlflow
    import urllib3

    errors = urllib3.exceptions
    return (requests.exceptions.ConnectionError, requests.exceptions.Timeout, errors.MaxRetryError,
            errors.NewConnectionError, errors.ProtocolError, errors.TimeoutError)


def is_transient_mlflow_error(error: BaseException) -> bool:
    """Tell whether an error of an MLflow call may clear by itself (worth retrying): a connection or
    timeout error, an MLflow error of a transient code or an HTTP 5xx/429, a locked sqlite database, or
    an error caused by one of these. Anything else (a refused value, a missing run, a bug) is permanent."""
    transient = getattr(error, "transient", None)
    if isinstance(transient, bool):  # the helper process's verdict
        return transient
    seen = 0
    while error is not None and seen < 5:  # the error and what caused it (``raise ... from``)
        if isinstance(error, (ConnectionError, TimeoutError)) or isinstance(error, _network_error_types()):
            return True
        code = getattr(error, "error_code", None)
        if isinstance(code, str) and (code in _TRANSIENT_ERROR_CODES
                                      or _TRANSIENT_MESSAGE.search(str(error))):
            return True
        if (isinstance(error, sqlite3.OperationalError) or type(error).__name__ == "OperationalError") and (
                "database is locked" in str(error)):
            return True
        error, seen = error.__cause__, seen + 1
    return False


def explain_mlflow_error(error: BaseException, uri: Optional[str] = None) -> tuple[str, Optional[str]]:
    """Why an MLflow call failed, whole, and its kind: ``"refused"``, ``"dns"`` or ``"tls"`` (the server
    cannot be reached, and waiting does not change that), ``"auth"`` (it refused the credentials),
    ``"timeout"``, or None (anything else: the error's own message, cut only past 1000 characters)."""
    if getattr(error, "message_is_cause", False):  # told already: the helper's verdict, an unreachable store
        return str(error), getattr(error, "kind", None)
    chain: list[BaseException] = []
    while error is not None and len(chain) < 10 and error not in chain:
        chain.append(error)
        reason = getattr(error, "reason", None)  # urllib3's MaxRetryError
        reason = reason if isinstance(reason, BaseException) else None
        error = error.__cause__ or error.__context__ or reason
    text = " ".join(str(each) for each in chain)
    parsed = urlparse(uri or "")
    try:
        port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)
    except ValueError:
        port = None
    place = f"{parsed.hostname}:{port}" if parsed.hostname else "the server"
    code = getattr(chain[0], "error_code", None)
    if any(isinstance(each, ConnectionRefusedError) for each in chain) or "Connection refused" in text:
        return (f"connection refused at {place}: nothing listens there (is the server running, and is the "
                "port right?)"), "refused"
    if any(isinstance(each, socket.gaierror) for each in chain) or "Failed to resolve" in text:
        return (f"the host name {parsed.hostname or ''!r} does not resolve (is it spelled right, and is this "
                "machine on its network?)"), "dns"
    tls = [each for each in chain if isinstance(each, ssl.SSLError)]
    if tls or "SSLError" in text:
        return (f"the TLS handshake with {place} failed ({tls[-1] if tls else text[-300:]}): an http:// "
                "server addressed as https://, or its certificate (MLFLOW_TRACKING_SERVER_CERT_PATH, "
                "MLFLOW_TRACKING_INSECURE_TLS)"), "tls"
    if code == "UNAUTHENTICATED" or "error code 401" in text:
        return (f"{place} refused the credentials (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN"), "auth"
    if code == "PERMISSION_DENIED" or "error code 403" in text:
        return (f"{place} refused access (HTTP 403): the credentials lack a permission on the experiment or "
                "the run"), "auth"
    if any("timeout" in type(each).__name__.lower() for each in chain) or "timed out" in text:
        return (f"no answer from {place} within the request timeout (MLFLOW_HTTP_REQUEST_TIMEOUT, "
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES)"), "timeout"
    message = f"{type(chain[0]).__name__}: {chain[0]}"
    if len(message) > 1000:
        message = f"{message[:1000].rsplit(' ', 1)[0]} ... ({len(message) - 1000} more characters)"
    return message, None
