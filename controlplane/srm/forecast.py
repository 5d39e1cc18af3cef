"""The predictive floor: the peak a job's history shows for the window it is about to enter.

Day of week and time of day: the hours of a week ago that cover [now, now + horizon] (their p95,
hourly rollups are kept 8 weeks); without them, the minutes of a day ago (points are kept 48 h).
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
    week = series.hours((m - WEEK) // 60, (m - WEEK + span) // 60 + 1)
    if week:
        return max(r[1] for _, r in week)
    day = series.minutes(m - DAY, m - DAY + span + 1)
    if day:
        return max(c for _, c, _ in day)
    return None


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
