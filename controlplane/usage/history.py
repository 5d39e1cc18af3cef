"""One job's or one entitlement's usage over time: a point a minute for the last 48 hours and an
hourly rollup (mean, p95, max) for 8 weeks, in arrays as long as what is held (bounded per series:
about 72 kB, however long it runs), and their form in etcd (usage/recorder.py writes them at each hour's end).

Time is in whole minutes and hours since the epoch (UTC). A point is the mean of the samples taken
in its minute; a minute without a sample (nothing measured: no task reported, or no leader) has no
point, and an hour without points has no rollup. CPU in millicores, memory in MiB (integers)."""

from __future__ import annotations

import base64
import math
import struct
import sys
import zlib
from array import array
from bisect import bisect_left, bisect_right
from typing import Iterable

MINUTES = 48 * 60  # points kept
HOURS = 8 * 7 * 24  # rollups kept
ROLLUP = 6  # cpu mean, p95, max; memory mean, p95, max
NONE = -1  # no minute: none being sampled, or none held (latest_minute)
SERIES_BYTES = 4 * (3 * MINUTES + HOURS * (1 + ROLLUP))  # a Series' arrays of int32 at most, however long it runs


def p95(values: list[int]) -> int:
    """The nearest-rank 95th percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def rollup(points: Iterable[tuple[int, int]]) -> tuple[int, ...] | None:
    cpu, mem = [], []
    for c, m in points:
        cpu.append(c)
        mem.append(m)
    if not cpu:
        return None
    return (round(sum(cpu) / len(cpu)), p95(cpu), max(cpu), round(sum(mem) / len(mem)), p95(mem), max(mem))


class Series:
    """Points and rollups in arrays sorted by their minute or hour, as many as there are: a series
    holds what it has measured, at most the window's (48 hours of minutes, 8 weeks of rollups:
    SERIES_BYTES, and what the arrays' growth leaves over, about a sixteenth), and gives its oldest
    point way to each new one past the window. In fixed arrays from its first sample on, as before
    issue #38, every job's history held its whole window, about 72 kB, at a minute old: a shard's
    leader of 1,200 young jobs held 90 MB of slots that held nothing. A series of 48 hours and 8
    weeks holds as much as it did then."""

    __slots__ = ("m_at", "m_val", "h_at", "h_val", "_minute", "_sum")

    def __init__(self) -> None:
        self.m_at = array("i")  # the minutes that have a point, oldest first
        self.m_val = array("i")  # millicores and MiB a minute, in m_at's order
        self.h_at = array("i")  # the hours that have a rollup, oldest first
        self.h_val = array("i")  # ROLLUP figures an hour, in h_at's order
        self._minute = NONE  # the minute being sampled
        self._sum = [0, 0, 0]  # its samples' cpu, memory, count

    # -- recording ----------------------------------------------------------------------------

    def sample(self, now: float, cpu: int, mem: int) -> int | None:
        """A sample at `now` (seconds). Returns the minute it closed, if it began another."""
        minute, closed = int(now // 60), None
        if minute != self._minute:
            closed = self.close()
            self._minute = minute
        s = self._sum
        s[0] += cpu
        s[1] += mem
        s[2] += 1
        return closed

    def close(self) -> int | None:
        """The minute being sampled becomes a point; returns it (None: there was none)."""
        minute, (c, m, n) = self._minute, self._sum
        self._minute, self._sum = NONE, [0, 0, 0]
        if minute == NONE or n == 0:
            return None
        self.put_minute(minute, round(c / n), round(m / n))
        return minute

    def put_minute(self, minute: int, cpu: int, mem: int) -> None:
        """A minute's point (it replaces the one that minute had); one older than the window of the
        newest held is left out."""
        _put(self.m_at, self.m_val, 2, minute, (cpu, mem), MINUTES)

    def put_hour(self, hour: int, values: tuple[int, ...]) -> None:
        """An hour's rollup, as put_minute does a minute's point."""
        _put(self.h_at, self.h_val, ROLLUP, hour, values, HOURS)

    def close_hour(self, hour: int) -> tuple[int, ...] | None:
        """The hour's rollup from its points (kept, and returned; None: it had no point). The
        minute being sampled is closed first when it is of that hour or before."""
        if self._minute != NONE and self._minute // 60 <= hour:
            self.close()
        values = rollup((c, m) for _, c, m in self.minutes(hour * 60, hour * 60 + 60))
        if values is not None:
            self.put_hour(hour, values)
        return values

    # -- reading ------------------------------------------------------------------------------

    def minutes(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(minute, millicores, MiB) of the points in [start, end), oldest first."""
        at, val = self.m_at, self.m_val
        i, j = bisect_left(at, max(start, end - MINUTES)), bisect_left(at, end)
        return list(zip(at[i:j], val[2 * i:2 * j:2], val[2 * i + 1:2 * j:2]))

    def hours(self, start: int, end: int) -> list[tuple[int, tuple[int, ...]]]:
        """(hour, rollup) of the hours in [start, end) that have one, oldest first."""
        at, val = self.h_at, self.h_val
        i, j = bisect_left(at, max(start, end - HOURS)), bisect_left(at, end)
        return [(at[k], tuple(val[k * ROLLUP:(k + 1) * ROLLUP])) for k in range(i, j)]

    def latest_minute(self) -> int:
        return self.m_at[-1] if self.m_at else NONE

    def nbytes(self) -> int:
        """The memory its points and rollups take (their arrays' buffers, as allocated)."""
        return sum(map(sys.getsizeof, (self.m_at, self.m_val, self.h_at, self.h_val)))


def _put(at: array, val: array, width: int, when: int, values: tuple[int, ...], window: int) -> None:
    """`values` (`width` of them) for `when` (a minute or an hour) into the sorted `at` and its rows
    in `val`: the row `when` had replaced; left out when past the window of the newest held; the
    oldest rows past the window of the newest given way."""
    if at and when <= at[-1] - window:
        return
    i = len(at) if not at or when > at[-1] else bisect_left(at, when)
    row = array("i", values)
    if i < len(at) and at[i] == when:
        val[i * width:(i + 1) * width] = row
        return
    at.insert(i, when)
    val[i * width:i * width] = row
    if (gone := bisect_right(at, at[-1] - window)) > 0:
        del at[:gone]
        del val[:gone * width]


# -- the form in etcd -----------------------------------------------------------------------------
# Integers packed little-endian, compressed, base64 in a JSON string: a record of 60 points is about
# 0.2-0.7 kB, a day of rollups about 0.3-1 kB (the note of issue #25 has measured figures).

def pack(values: Iterable[int]) -> str:
    values = list(values)
    return base64.b64encode(zlib.compress(struct.pack(f"<{len(values)}i", *values), 9)).decode()


def unpack(text: str, width: int) -> list[tuple[int, ...]]:
    """ValueError: not what pack wrote, or not rows of `width`."""
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
    except (zlib.error, ValueError) as e:
        raise ValueError(f"not packed figures: {e}") from None
    if len(raw) % (4 * width):
        raise ValueError(f"{len(raw)} bytes are not rows of {width} figures")
    flat = struct.unpack(f"<{len(raw) // 4}i", raw)
    return [flat[i:i + width] for i in range(0, len(flat), width)]


def hour_record(series: Series, hour: int) -> dict:
    """The hour's points: {"points": packed [minute - hour*60, millicores, MiB]...}."""
    rows = [(minute - hour * 60, c, m) for minute, c, m in series.minutes(hour * 60, hour * 60 + 60)]
    return {"points": pack(v for row in rows for v in row)}


def day_record(series: Series, day: int) -> dict:
    """The day's rollups: {"hours": packed [hour - day*24, six figures]...}."""
    rows = [(hour - day * 24, *values) for hour, values in series.hours(day * 24, day * 24 + 24)]
    return {"hours": pack(v for row in rows for v in row)}


def load_hour(series: Series, hour: int, record: dict) -> None:
    for offset, c, m in unpack(record["points"], 3):
        if 0 <= offset < 60:
            series.put_minute(hour * 60 + offset, c, m)


def load_day(series: Series, day: int, record: dict) -> None:
    for offset, *values in unpack(record["hours"], 1 + ROLLUP):
        if 0 <= offset < 24:
            series.put_hour(day * 24 + offset, tuple(values))
