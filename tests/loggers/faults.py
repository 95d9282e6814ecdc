"""Fault injection around a real backend: the only way to make MLflow or W&B fail, hang or be slow
exactly when a test wants. Every other behaviour is the real backend's. Also a training in the
loop whose user code can fail at a chosen step (`train_in_loop`)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional


class FaultInjectingBackend:
    """Wraps a real `Backend` and counts its calls (``calls``).

    Methods named in ``failing`` raise ``ConnectionError`` (or what ``error`` makes: a bug of ours,
    such as a ``TypeError``) while ``down`` is True; methods in ``gated`` wait until ``gate`` is set
    (a store that hangs, released by the test); methods in ``slow`` first sleep ``delay`` seconds.
    """

    def __init__(self, backend: Any, failing: tuple[str, ...] = (), down: bool = True,
                 gated: tuple[str, ...] = (), slow: tuple[str, ...] = (), delay: float = 0.0,
                 error: Optional[Callable[[str], BaseException]] = None) -> None:
        self.wrapped = backend
        self.failing = set(failing)
        self.down = down
        self.gated = set(gated)
        self.gate = threading.Event()
        self.entered = threading.Event()  # a gated call has begun
        self.slow = set(slow)
        self.delay = delay
        self.error = error or (lambda name: ConnectionError(
            f"injected fault: {name} while the backend is unreachable"))
        self.calls: dict[str, int] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        """Settings of the real backend (``run_name``, set by the logger) reach it; the wrapper's own
        attributes stay on the wrapper."""
        wrapped = self.__dict__.get("wrapped")
        if wrapped is not None and name not in self.__dict__ and hasattr(wrapped, name):
            setattr(wrapped, name, value)
        else:
            super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.wrapped, name)
        if not callable(attribute) or name.startswith("_") or isinstance(attribute, type):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.gated:
                self.entered.set()
                self.gate.wait(120)
            if name in self.slow:
                time.sleep(self.delay)
            if self.down and name in self.failing:
                raise self.error(name)
            return attribute(*args, **kwargs)

        return call


class SlowInitWandb:
    """Fault injection: the real ``wandb`` module whose ``init`` waits for ``gate`` (or ``delay``
    seconds): W&B offline cannot be made slow for real."""

    def __init__(self, wandb: Any, delay: float = 120.0) -> None:
        self._wandb, self._delay = wandb, delay
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wandb, name)

    def init(self, *args: Any, **kwargs: Any) -> Any:
        self.gate.wait(self._delay)
        return self._wandb.init(*args, **kwargs)


class FailingInitWandb(SlowInitWandb):
    """Fault injection: a ``wandb.init`` that raises once ``gate`` is set, as when W&B's server cannot
    be reached."""

    def init(self, *args: Any, **kwargs: Any) -> Any:
        self.gate.wait(self._delay)
        raise ConnectionError("W&B server unreachable (injected)")


def train_in_loop(out: Any, callbacks: list, steps: int, fail_at: Optional[int] = None,
                  save_steps: Optional[int] = None, resume_from: Optional[str] = None) -> Any:
    """``steps`` logged steps of `LightweightTrainer` (loss ``1/step``); the user's step raises
    ``RuntimeError`` at step ``fail_at``; a checkpoint every ``save_steps`` steps if given; resumed from
    the checkpoint ``resume_from`` if given."""
    from hf_callbacks_plus.loop.arguments import LoopArguments
    from hf_callbacks_plus.loop.trainer import LightweightTrainer

    args = LoopArguments(output_dir=str(out), max_steps=steps, logging_steps=1, disable_tqdm=True,
                         save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500)
    calls = {"n": 0}

    def step(batch: Any) -> float:
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("user code failed")
        return 1.0 / calls["n"]

    return LightweightTrainer(args, train_step=step, train_data=[[1.0]] * steps, callbacks=callbacks,
                              learning_rate_fn=lambda: 0.1).train(resume_from_checkpoint=resume_from)


class RefusingHttpServer:
    """Fault injection: a real HTTP server on 127.0.0.1 answering every request with ``status`` and the
    body of MLflow's authentication app (an MLflow server behind authentication, given no or wrong
    credentials: 401, or credentials without the permission: 403). Addressed with ``https://`` it is a
    server that does not speak TLS."""

    def __init__(self, status: int) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        body = {401: b"You are not authenticated. Please see https://www.mlflow.org/docs/latest/auth/index.html"
                     b"#authenticating-to-mlflow on how to authenticate.",
                403: b"Permission denied"}.get(status, b"")

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = answer

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
