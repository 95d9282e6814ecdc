"""The signal handlers of `Deadline`: they only record that a signal came (and when).

Python runs a handler on the main thread between two bytecodes, wherever training is (inside a
step, an evaluation, a save); anything more than setting a flag there (a save, a collective) could
run in the middle of an optimizer step or a collective the other ranks are in. The callback reads
the flag at the next step boundary, where the ranks agree.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable, Optional, Union

__all__ = ["SignalFlag", "signal_names"]

logger = logging.getLogger("hf_callbacks_plus")

SignalArg = Union[str, int, signal.Signals]
#: Left to Python and the user (Ctrl-C raises KeyboardInterrupt); SIGKILL/SIGSTOP cannot be caught.
REFUSED = {"SIGINT": "SIGINT (Ctrl-C) is left to Python's KeyboardInterrupt",
           "SIGKILL": "SIGKILL cannot be caught", "SIGSTOP": "SIGSTOP cannot be caught"}


def signal_names(signals: Optional[Iterable[SignalArg]]) -> tuple[str, ...]:
    """Canonical names (``"SIGTERM"``) of ``signals`` (names, numbers or ``signal.Signals``).

    Raises:
        TypeError, ValueError: Not an iterable of signals, an unknown name, or SIGINT/SIGKILL/SIGSTOP.
    """
    if signals is None:
        return ()
    if isinstance(signals, (str, int)):
        signals = (signals,)
    try:
        items = list(signals)
    except TypeError:
        raise TypeError(f"Deadline: signals must be a list of signal names such as ['SIGTERM', 'SIGUSR1'], "
                        f"got {signals!r}.") from None
    names: list[str] = []
    for item in items:
        try:
            if isinstance(item, str):
                text = item.strip().upper()
                name = signal.Signals[text if text.startswith("SIG") else f"SIG{text}"].name
            elif isinstance(item, int) and not isinstance(item, bool):
                name = signal.Signals(item).name
            else:
                raise TypeError
        except (KeyError, ValueError):
            valid = sorted(s.name for s in signal.Signals if s.name not in REFUSED)
            raise ValueError(f"Deadline: signals holds {item!r}, which is not a signal here; valid names: "
                             f"{', '.join(valid)}.") from None
        except TypeError:
            raise TypeError(f"Deadline: signals must hold signal names or numbers, got {item!r} "
                            f"({type(item).__name__}).") from None
        if name in REFUSED:
            raise ValueError(f"Deadline: signals={list(items)!r}: {REFUSED[name]}; choose others "
                             f"(SIGTERM, SIGUSR1, SIGUSR2...).")
        if name not in names:
            names.append(name)
    return tuple(names)


class SignalFlag:
    """Handlers for ``names`` that record the first signal received and its time.

    Args:
        names: Canonical signal names.
        clock: The clock the time is read on. Defaults to ``time.monotonic``.
    """

    def __init__(self, names: Iterable[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.names = tuple(names)
        self.clock = clock
        #: ``(name, time)`` of the first signal since `install`, else None.
        self.received: Optional[tuple[str, float]] = None
        #: Every signal received since `install` (names, in order).
        self.all_received: list[str] = []
        self._previous: dict[int, Any] = {}

    @property
    def installed(self) -> bool:
        """Whether the handlers are in place."""
        return bool(self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.all_received.append(name)
        if self.received is None:
            self.received = (name, self.clock())

    def install(self) -> bool:
        """Put the handlers in place (forgetting any earlier signal); False off the main thread.

        A Python handler another library had installed for one of these signals is replaced until
        `restore` (named in an INFO line).
        """
        self.received, self.all_received = None, []
        if not self.names:
            return True
        if threading.current_thread() is not threading.main_thread():
            logger.warning("Deadline: training runs off the main thread, where Python cannot install signal "
                           "handlers; %s will not stop it gracefully.", ", ".join(self.names))
            return False
        for name in self.names:
            signum = signal.Signals[name]
            previous = signal.signal(signum, self._handle)
            self._previous[int(signum)] = previous
            if callable(previous) and previous is not signal.default_int_handler \
                    and getattr(previous, "__self__", None) is not self:
                logger.info("Deadline: %s's handler %r is replaced during training (restored after).",
                            name, previous)
        return True

    def restore(self) -> None:
        """Put back the handlers found at `install`."""
        for signum, previous in self._previous.items():
            try:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):  # off the main thread, or a foreign handler object
                logger.debug("Deadline: could not restore the handler of signal %s.", signum)
        self._previous = {}
