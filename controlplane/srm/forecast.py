"""The predictive floor: the peak a job's history shows for the window it is about to enter.

Day of week and time of day: the hours of a week ago around [now, now + horizon] (hourly rollups
are kept 8 weeks), each hour's p95 taken as the level at the hour's middle and joined to the next
by a straight line, the line's highest over the window; without them, the minutes of a day ago
(points are kept 48 h). An hour's p95 on a rising load is about its end's level: taken for the
whole hour (as until issue #36's fifth turn) it held that capacity from the hour's start, up to an
hour early, and as the scale-in's floor on a falling load held the hour's start level to its end.
The horizon covers the job's measured start-up time, so that tasks asked for now run when the load
comes. In millicores, as the history keeps CPU; None when the history has nothing for the window."""

from __future__ import annotations

import math

from controlplane.usage.history import Series

DAY, WEEK = 24 * 60, 7 * 24 * 60  # in minutes
EVERY = 300.0  # seconds a forecast serves (its window reaches that much further)


def peak(series: Series, now: float, horizon: float) -> int | None:
    m = int(now // 60)
    span = max(1, math.ceil(horizon / 60))
    lo, hi = m - WEEK, m - WEEK + span  # the window a week ago, in minutes
    # the hours covering it and one each side (their middles bound the line over the window)
    week = series.hours(lo // 60 - 1, hi // 60 + 2)
    if week:
        return round(max(_line(week, lo), _line(week, hi),
                         *(r[1] for h, r in week if lo <= h * 60 + 30 <= hi)))
    day = series.minutes(m - DAY, m - DAY + span + 1)
    if day:
        return max(c for _, c, _ in day)
    return None


def _line(week: list[tuple[int, tuple[int, ...]]], minute: int) -> float:
    """The hours' p95s, each at its hour's middle, joined by straight lines, at `minute` (the
    first's or the last's before or after them all)."""
    points = [(h * 60 + 30, r[1]) for h, r in week]
    if minute <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if minute <= x1:
            return y0 + (y1 - y0) * (minute - x0) / (x1 - x0)
    return points[-1][1]


def refresh(mem, series: Series | None, now: float, lead: float) -> None:
    """A job's forecasts in its recommender's Memory (srm/recommend.py), read again once the last
    has served EVERY seconds: the peak of the horizon (`lead`, its start-up time and measurement
    delay, + EVERY: a scale-out's floor) and of the hour after it (a scale-in's floor), in cores."""
    if now < mem.forecast_until:
        return
    horizon = lead + EVERY
    mc = peak(series, now, horizon) if series is not None else None
    hour = peak(series, now, horizon + 3600) if series is not None else None
    mem.forecast = None if mc is None else mc / 1000
    mem.forecast_hour = None if hour is None else hour / 1000
    mem.forecast_until = now + EVERY
