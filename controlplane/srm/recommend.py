"""A job's size from its measured load and its history: pure, one call per job per interval.

- reactive: ceil(load / per_task), where per_task is the load one task should carry (target_cpu x
  the task's cpus, or the metric's target); no change while load per running task is within
  target x (1 +- tolerance);
- predictive: the same of the forecast peak of the next horizon (forecast.py), a floor;
- the recommendation: the larger of the two, clamped to min/max and to what the entitlement's
  quota holds for the job.

Growth happens at once when measured load asks for it; growth on the forecast alone spends the flap
budget. Shrinking happens on measured load only: to the largest reactive size of the last
`scale_down_after` seconds (all of them measured, none stale), never below the forecast peak of the
coming hour (what it would grow back to within the hour), and only while the flap budget (size
changes in the last hour) has room. A scale-in stops whole machines' worth of tasks: given the sizes
at which the job's stops empty a machine (`frees`, victims.frees), it goes to the smallest of them at
or above that size, and not at all while none is (a stop that hands back no machine saves nothing,
and takes serving room away); the machine boundary is the scale-in's hysteresis. Without them, or
where the job shares every machine with other jobs, a step of at least the tolerance. Missing or
stale measurements freeze scale-in."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from controlplane.store.autoscale import Autoscale

DEFAULT_STARTUP = 60.0  # seconds from a scale-out to its tasks running, until one is measured
REPORTING = 0.8  # of the running tasks must report usage for a CPU reading to count
SKILL_KEPT = 96  # forecasts whose skill is kept (a day's worth that asked for a rise, at one each 5 minutes)
TRUST_AFTER = 6  # forecasts judged before a forecast's rises are trusted less than fully


@dataclass(frozen=True, slots=True)
class Reading:
    """What was measured of a job: its total load (cores used, or the metric's value; None:
    nothing), how old that is, and how many of its tasks were running when measured."""

    load: float | None
    age: float = 0.0
    running: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    size: int  # the size the job should have now (its current size: no change)
    recommended: int  # max(reactive, predictive) clamped, before the budget and the scale-in rules
    reactive: int | None
    predictive: int | None
    reason: str
    stale: bool = False  # no fresh measurement: scale-in is frozen
    clamped: str = ""  # why the recommendation was held below what load asks (max, quota)


def usage_reading(millicores: float | None, reporting: int, running: int) -> Reading:
    """A job's CPU reading from its usage sum over the `reporting` tasks that sent one: nothing when
    fewer than REPORTING of its running tasks report; the sum scaled to all running tasks when
    some are missing (each missing task counted at the reporters' mean), so that a partial report
    never reads as a fall in load."""
    if millicores is None or not reporting or reporting < REPORTING * running:
        return Reading(None, math.inf, running)
    return Reading(millicores / 1000 * max(1.0, running / reporting), 0.0, running)


@dataclass(slots=True)
class Memory:
    """What the recommender keeps of one job between calls."""

    window: deque = field(default_factory=deque)  # (at, reactive), its maximum first (a monotonic deque)
    fresh_since: float | None = None  # measured without a stale reading since then
    changes: deque = field(default_factory=deque)  # when the size changed in the last hour
    startup: float = DEFAULT_STARTUP
    grew: tuple[float, int] | None = None  # a scale-out not yet all running: (when, to what size)
    forecast: float | None = None  # the forecast peak of the horizon (CPU cores), kept until forecast_until
    forecast_hour: float | None = None  # the forecast peak of the coming hour: a scale-in stays above it
    forecast_until: float = -math.inf
    last: Decision | None = None
    # The forecast's skill (trust()): each forecast read is judged at the end of the horizon it was
    # read for (forecast_until + startup): [when, need measured when it was read, tasks it asked
    # for, peak need measured since] (tasks: load / per task); one that asked for a rise beyond the
    # tolerance keeps the share of it that came.
    judged: float = -math.inf  # the forecast_until of the last forecast taken for judging
    pending: deque = field(default_factory=deque)
    skill: deque = field(default_factory=lambda: deque(maxlen=SKILL_KEPT))
    trust: float = 1.0  # the share of a forecast rise taken as a floor (1: all of it)

    def changed(self, now: float, old: int, new: int) -> None:
        """The job's size changed from `old` to `new` (the service calls this when it resized)."""
        self.changes.append(now)
        self.grew = (now, new) if new > old else None

    def ran(self, now: float, running: int) -> None:
        """A scale-out is measured when all its tasks run: the start-up time the forecast's horizon covers."""
        if self.grew is not None and running >= self.grew[1]:
            seconds = now - self.grew[0]
            self.startup = seconds if self.startup == DEFAULT_STARTUP else 0.7 * self.startup + 0.3 * seconds
            self.grew = None


def trust(skill) -> float:
    """The share of a forecast rise a job takes as a floor: the mean share of the rises its
    forecasts asked for that came within their horizon (Memory.skill, each within 0..1). A history that
    repeats (a diurnal load) keeps nearly all of it; one whose bursts fall at other times each week
    keeps little, and holds no capacity for load that does not come."""
    if len(skill) < TRUST_AFTER:
        return 1.0
    return sum(skill) / len(skill)


def judge(p: Autoscale, mem: Memory, now: float) -> None:
    """The forecasts whose horizon has passed, against the load that came within it."""
    while mem.pending and mem.pending[0][0] <= now:
        _, base, asked, seen = mem.pending.popleft()
        if asked > base * (1 + p.tolerance):  # it asked for a rise
            mem.skill.append(min(1.0, max(0.0, (seen - base) / (asked - base))))
            mem.trust = trust(mem.skill)


def budget_left(p: Autoscale, mem: Memory, now: float) -> int:
    ch = mem.changes
    while ch and ch[0] <= now - 3600:
        ch.popleft()
    return p.max_changes_per_hour - len(ch)


def recommend(p: Autoscale, mem: Memory, now: float, size: int, reading: Reading, per_task: float,
              forecast_per_task: float, room: int | None = None, stale_after: float = 60.0,
              frees: Callable[[], Sequence[int]] | None = None) -> Decision:
    """The job's size now. `per_task`: the load one task should carry (the reading's units);
    `forecast_per_task`: the same in CPU cores, for mem.forecast (the job's CPU history); `room`:
    tasks of this job the entitlement's quota holds beside its other jobs (None: no bound): it bounds
    growth only; tasks that run already are not stopped for it. `frees`: the sizes, largest first,
    at which a scale-in empties a machine (victims.frees), asked for only when one is considered."""
    hi = p.max if room is None else max(0, min(p.max, room))
    lo = min(p.min, max(hi, size))
    clamped = "" if hi == p.max else f"quota holds {room} of its tasks (max {p.max})"
    load = reading.load
    fresh = load is not None and reading.age <= stale_after
    reactive = None
    if fresh:
        if mem.fresh_since is None:
            mem.fresh_since = now
        measured = reading.running or size
        ratio = load / (measured * per_task) if measured else math.inf
        need = load / per_task
        reactive = size if abs(ratio - 1.0) <= p.tolerance else math.ceil(need - 1e-9)
        for e in mem.pending:
            e[3] = max(e[3], need)
        w = mem.window  # what load asked for, within the tolerance or not: the scale-in's own rules judge
        exact = math.ceil(need - 1e-9)
        while w and w[-1][1] <= exact:
            w.pop()
        w.append((now, exact))
    else:
        mem.fresh_since = None
        mem.window.clear()
    w = mem.window
    while w and w[0][0] < now - p.scale_down_after:
        w.popleft()
    # a forecast's rise over what is measured now (or over the size, with nothing measured) is taken
    # as far as its rises have come (trust)
    ref = load / per_task if fresh else size

    def floor(forecast: float) -> int:
        asked = math.ceil(forecast / forecast_per_task - 1e-9)
        return asked if asked <= ref else math.ceil(ref + mem.trust * (asked - ref) - 1e-9)

    predictive = None
    if p.predictive and mem.forecast is not None:
        if fresh and mem.judged != mem.forecast_until:
            mem.judged = mem.forecast_until
            asked = math.ceil(mem.forecast / forecast_per_task - 1e-9)
            mem.pending.append([mem.forecast_until + mem.startup, need, asked, need])
        predictive = floor(mem.forecast)
    judge(p, mem, now)
    want = max(reactive or 0, predictive or 0) if (reactive is not None or predictive is not None) else size
    if want > hi and not clamped:
        clamped = f"max {p.max}"
    recommended = max(lo, min(want, max(hi, min(size, p.max))))

    def decide(new: int, why: str) -> Decision:
        d = Decision(new, recommended, reactive, predictive, why, not fresh, clamped if want > hi else "")
        mem.last = d
        return d

    if size < lo:
        return decide(lo, f"below min {p.min}")
    if size > p.max:
        return decide(p.max, f"above max {p.max}")
    if recommended > size:
        if reactive is not None and reactive > size:
            return decide(recommended, f"load {load:.2f} needs {reactive} at {per_task:g} a task")
        if budget_left(p, mem, now) > 0:
            return decide(recommended, f"forecast peak {mem.forecast:.2f} needs {predictive}")
        return decide(size, f"forecast peak needs {predictive}; flap budget spent ({p.max_changes_per_hour}/h)")
    if not fresh:
        return decide(size, "scale-in frozen: no fresh measurement" + ("" if load is None else
                                                                        f" (the last is {reading.age:.0f} s old)"))
    hold = 0
    if p.predictive and mem.forecast_hour is not None:
        hold = floor(mem.forecast_hour)
    target = max(w[0][1] if w else size, predictive or 0, hold, lo)
    if target >= size:
        return decide(size, f"load {load:.2f} fits {size} at {per_task:g} a task")
    sizes = list(frees()) if frees is not None else []
    fit, emptied = target, ""
    if sizes:
        whole = [n for n in sizes if target <= n < size]
        if not whole:
            return decide(size, f"load fits {target}; no machine empties at {target} or above")
        target = min(whole)
        emptied = f" (to {target}: {len(whole)} machine(s) emptied)"
    elif size - target < p.tolerance * size and target > lo:
        # no step smaller than the tolerance: a step that small is noise's, and comes back
        return decide(size, f"load {load:.2f} fits {size} at {per_task:g} a task")
    if mem.fresh_since > now - p.scale_down_after:
        return decide(size, f"load fits {fit}; measured for {now - mem.fresh_since:.0f} of the "
                            f"{p.scale_down_after:.0f} s scale_down_after")
    if budget_left(p, mem, now) <= 0:
        return decide(size, f"load fits {fit}; flap budget spent ({p.max_changes_per_hour}/h)")
    return decide(target, f"load {load:.2f} fit {fit} for {p.scale_down_after:.0f} s{emptied}")
