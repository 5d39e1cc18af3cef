"""The predictive floor: the peak a job's history shows for the window it is about to enter.

Day of week and time of day: the hours of a week ago that cover [now, now + horizon] (their p95,
hourly rollups are kept 8 weeks); without them, the minutes of a day ago (points are kept 48 h).
The horizon covers the job's measured start-up time, so that tasks asked for now run when the load
comes. In millicores, as the history keeps CPU; None when the history has nothing for the window."""

from __future__ import annotations

import math

from controlplane.usage.history import Series

DAY, WEEK = 24 * 60, 7 * 24 * 60  # in minutes


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
