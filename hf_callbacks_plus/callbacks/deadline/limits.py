"""The time limits `Deadline` takes: a duration for this process, a budget across resumes, an
absolute time; how they are written and where they end on the process's monotonic clock."""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Optional, Union

__all__ = ["DurationArg", "InstantArg", "parse_at", "parse_duration", "process_age", "show_seconds"]

DurationArg = Union[None, float, int, str, _dt.timedelta, Mapping[str, float]]
InstantArg = Union[None, float, int, _dt.datetime]

#: ``[D-]H:MM:SS`` (SLURM's ``--time``) or ``DD:HH:MM:SS`` (Lightning's ``Timer``).
_SLURM = re.compile(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)")
_DAYS = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")
FORMATS = ("seconds as a number", "'H:MM:SS'", "'D-H:MM:SS' (SLURM's --time)", "'DD:HH:MM:SS'",
           "a datetime.timedelta", "a dict of timedelta arguments ({'hours': 4})")


def parse_duration(value: DurationArg, name: str) -> Optional[float]:
    """Seconds in ``value`` (None stays None).

    Args:
        value: Seconds (a number), ``"H:MM:SS"``, ``"D-H:MM:SS"``, ``"DD:HH:MM:SS"``, a
            ``timedelta`` or a dict of ``timedelta`` arguments.
        name: The argument's name, for errors.

    Raises:
        TypeError, ValueError: Anything else, minutes or seconds above 59 (hours above 23 after
            days), or a duration that is not positive.
    """
    if value is None:
        return None
    seconds: Optional[float] = None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, Mapping):
        try:
            seconds = _dt.timedelta(**value).total_seconds()
        except TypeError as error:
            raise TypeError(f"Deadline: {name}={value!r} is not a valid duration ({error}).") from None
    elif isinstance(value, str):
        text = value.strip()
        found = _SLURM.fullmatch(text) or _DAYS.fullmatch(text)
        if not found:
            raise ValueError(f"Deadline: {name}={value!r} is not a duration; write one of: "
                             f"{', '.join(FORMATS)}.")
        with_days = found.re is _DAYS or found.group(1) is not None
        d, h, m, s = (int(part or 0) for part in found.groups())
        seconds = float(((d * 24 + h) * 60 + m) * 60 + s)
        for unit, number, top in (("hours", h, 23 if with_days else None), ("minutes", m, 59),
                                  ("seconds", s, 59)):
            if top is not None and number > top:
                raise ValueError(
                    f"Deadline: {name}={value!r} has {number} {unit}; write 'H:MM:SS', 'D-H:MM:SS' or "
                    f"'DD:HH:MM:SS' with minutes and seconds from 00 to 59 and hours after days from 0 to 23 "
                    f"({value!r} would be {show_seconds(seconds)!r}, or {seconds:g} seconds).")
    if seconds is None:
        raise TypeError(f"Deadline: {name} must be one of: {', '.join(FORMATS)}; got {value!r} "
                        f"({type(value).__name__}).")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"Deadline: {name} must be a positive, finite duration, got {value!r}.")
    return seconds


def parse_at(value: InstantArg) -> Optional[float]:
    """The UNIX time of ``value``: a number (UNIX seconds) or a ``datetime`` (naive = local time).

    Raises:
        TypeError: Anything else.
    """
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise TypeError(f"Deadline: at must be a datetime.datetime or a UNIX time in seconds, got {value!r} "
                    f"({type(value).__name__}).")


def process_age() -> Optional[float]:
    """Seconds since this process started, from ``/proc`` (Linux); None where it cannot be read.

    A duration such as SLURM's ``--time`` counts from the job's start, not from the callback's
    creation: imports and model loading count too.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def show_seconds(seconds: Any) -> str:
    """``3:05:07`` for durations of a minute or more, ``12.3 s`` below."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return str(seconds)
    if abs(seconds) < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    sign, whole = ("-" if whole < 0 else ""), abs(whole)
    return f"{sign}{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
