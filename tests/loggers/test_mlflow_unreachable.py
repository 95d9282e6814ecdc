"""A tracking URI that cannot be reached is told at once, with its cause, and training goes on: a
refused connection (nothing listens), a host name that does not resolve, a TLS handshake that fails, a
server that refuses the credentials (401) or the permission (403); with MLflow's own HTTP retries (its
default) and without them (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``). The end of ``train()`` waits for
nothing it knows cannot come (``flush_timeout`` is 300 s here: a wait would show), the end message
and ``replay`` give the whole cause.

Real connections: a port nothing listens on, the reserved ``.invalid`` domain, and a real HTTP server
on 127.0.0.1 (``RefusingHttpServer``, fault injection: what an MLflow server behind authentication
answers; addressed with https://, a server that does not speak TLS).
"""

from __future__ import annotations

import logging
import time

import pytest

pytest.importorskip("mlflow")

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from tests.loggers.conftest import free_port  # noqa: E402
from tests.loggers.faults import RefusingHttpServer, train_in_loop  # noqa: E402
from tests.loggers.test_wal import AtStep  # noqa: E402

pytestmark = pytest.mark.mlflow

#: kind -> (what the cause must say, whether a server is needed: its HTTP status)
CAUSES = {
    "refused": ("connection refused at 127.0.0.1:{port}: nothing listens there", None),
    "dns": ("the host name 'no-such-host.invalid' does not resolve", None),
    "tls": ("the TLS handshake with 127.0.0.1:{port} failed", 200),
    "401": ("127.0.0.1:{port} refused the credentials (HTTP 401): set MLFLOW_TRACKING_USERNAME", 401),
    "403": ("127.0.0.1:{port} refused access (HTTP 403)", 403),
}


@pytest.fixture
def unreachable(request):
    """``(tracking URI, the cause its messages must give)`` for the kind in ``request.param``."""
    cause, status = CAUSES[request.param]
    server = RefusingHttpServer(status) if status else None
    port = server.port if server else free_port()
    uri = {"refused": f"http://127.0.0.1:{port}", "dns": "http://no-such-host.invalid:5000",
           "tls": f"https://127.0.0.1:{port}"}.get(request.param, server.uri if server else None)
    yield uri, cause.format(port=port)
    if server is not None:
        server.close()


@pytest.mark.parametrize("retries", ["0", None], ids=["no-retries", "mlflows-retries"])
@pytest.mark.parametrize("unreachable", list(CAUSES), indirect=True)
def test_an_unreachable_store_is_told_at_once_with_its_cause_and_the_end_waits_for_nothing(
        tmp_path, unreachable, retries, monkeypatch, caplog, capsys):
    uri, cause = unreachable
    if retries is not None:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", retries)
    logger = MLflowLogger(tracking_uri=uri, flush_timeout=300.0)
    told = []

    def told_during_training():  # a gate: the training waits (at most 60 s) until the cause is told
        end = time.monotonic() + 60
        while cause not in caplog.text and time.monotonic() < end:
            time.sleep(0.01)
        told.append(cause in caplog.text)

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        state = train_in_loop(tmp_path, [AtStep(3, told_during_training), logger], 20)
    assert told == [True] and state.global_step == 20  # told at once; training went on
    ours = [r.getMessage() for r in caplog.records if r.name == "hf_callbacks_plus"]
    first = [m for m in ours if cause in m]
    assert len(first) >= 2 and uri in first[0], ours  # when met, and at the end
    (end,) = [m for m in ours if "not delivered" in m]
    assert cause in end and "21 log record(s) (66 points, steps 1-20), the params" in end, end
    assert not [m for m in ours if "has not answered" in m or "too slow" in m], ours

    capsys.readouterr()
    assert cli(["replay", str(tmp_path / ".mlflow_wal")]) == 1
    printed = capsys.readouterr().out
    assert f"to the store at {uri}, experiment Default" in printed, printed
    assert f"NOT sent: {cause}" in printed, printed
    assert logger.wal_path.exists()  # kept for a replay once the cause is fixed
