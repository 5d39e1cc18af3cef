"""twinectl's kinds of argument value: seconds, counts, durations (90s, 10m, 2h, 1d), times (now,
+10m, epoch seconds, a local ISO time), spreads (dc,msb) and values that clear (none)."""

from __future__ import annotations

import argparse
import time
from datetime import datetime


def seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 seconds")
    return v


def count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return v


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """`90`, `90s`, `10m`, `2h`, `1d` -> seconds (> 0)."""
    t = text.strip().lower()
    unit = UNITS.get(t[-1:], None)
    try:
        v = float(t[:-1] if unit else t) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m, 2h or 1d") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return v


NOW: list[float] = []


def now() -> float:
    """One `now` for the whole command: `--start +1h --deadline +1h` are the same time."""
    if not NOW:
        NOW.append(time.time())
    return NOW[0]


def when(text: str) -> float:
    """`now`, `+10m`, seconds since the epoch, or a local ISO time -> seconds since the epoch."""
    t = text.strip()
    if t.lower() == "now":
        return now()
    if t.startswith("+"):
        return now() + duration(t[1:])
    try:
        v = float(t)
        if not 0 < v < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not a time")
        return v
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: now, +10m, epoch seconds or 2026-11-21T14:00") from None


def spread(text: str) -> list[str]:
    """`dc,msb` -> ["dc", "msb"]; `` or `none` -> [] (no spread)."""
    if text.strip().lower() in ("", "none"):
        return []
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of properties, e.g. dc,msb")
    return parts


def nullable(text: str) -> str | None:
    """`` or `none` clears the value (null)."""
    return None if text.strip().lower() in ("", "none") else text
