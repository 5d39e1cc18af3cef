"""The agent's reconciler: a pure function from desired tasks and actual containers to a plan.

Level-triggered: it is run on every change and on a steady interval, and whatever it missed last
time it repairs now. Buckets are named after what they mean (as in Nomad's reconciler).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agent.models import TaskKey, TaskSpec
from agent.runtime.base import ContainerInfo

MAX_BACKOFF = 30.0


def restart_backoff(generation: int) -> float:
    """Seconds to wait before starting generation+1 after generation exited: 1, 2, 4 ... 30."""
    return min(2.0 ** max(generation - 1, 0), MAX_BACKOFF)


def parse_time(ts: str) -> float | None:
    """Docker's RFC 3339 timestamps (nanoseconds, 'Z') to epoch seconds; None for the zero time."""
    if not ts or ts.startswith("0001-"):
        return None
    main, _, frac = ts.rstrip("Z").partition(".")
    frac = frac.split("+")[0].split("-")[0]
    return datetime.fromisoformat(main + "+00:00").timestamp() + (float("0." + frac) if frac else 0.0)


@dataclass(frozen=True)
class Plan:
    keep: tuple[ContainerInfo, ...] = ()  # running as desired: adopted, never restarted
    place: tuple[tuple[TaskSpec, int], ...] = ()  # no container yet: start generation n
    update: tuple[tuple[ContainerInfo, TaskSpec, int], ...] = ()  # spec changed: replace it
    restart: tuple[tuple[ContainerInfo, TaskSpec, int], ...] = ()  # exited: start the next one
    stop: tuple[ContainerInfo, ...] = ()  # not desired (or a duplicate): stop and remove
    waiting: tuple[tuple[TaskKey, str], ...] = ()  # desired but held back, with why
    due_at: float | None = None  # when the first restart held back by its backoff is due

    def empty(self) -> bool:
        return not (self.place or self.update or self.restart or self.stop)


def plan(desired: tuple[TaskSpec, ...], actual: list[ContainerInfo], profile_ready: bool, now: float) -> Plan:
    by_task: dict[TaskKey, list[ContainerInfo]] = {}
    for c in actual:
        by_task.setdefault(c.task, []).append(c)
    wanted = {t.key: t for t in desired}
    keep, place, update, restart, stop, waiting = [], [], [], [], [], []
    due: list[float] = []

    for key, containers in by_task.items():
        if key not in wanted:
            stop.extend(containers)

    for spec in desired:
        containers = sorted(by_task.get(spec.key, []), key=lambda c: (c.running, c.generation))
        current = containers[-1] if containers else None
        stop.extend(containers[:-1])  # duplicates and old generations: only one per task
        if current is None:
            if profile_ready:
                place.append((spec, 1))
            else:
                waiting.append((spec.key, "host profile not applied yet"))
            continue
        same_spec = current.spec_hash == spec.spec_hash()
        if same_spec and current.running:
            keep.append(current)
        elif not profile_ready:
            waiting.append((spec.key, "host profile not applied yet"))
            if current.running:
                keep.append(current)
        elif not same_spec:
            update.append((current, spec, 1))
        else:
            finished = parse_time(current.finished_at) or 0.0
            wait = finished + restart_backoff(current.generation) - now
            if wait > 0:
                due.append(now + wait)
                waiting.append((spec.key, f"exited with {current.exit_code}; restarting in {wait:.1f}s"))
            else:
                restart.append((current, spec, current.generation + 1))
    return Plan(tuple(keep), tuple(place), tuple(update), tuple(restart), tuple(stop), tuple(waiting), min(due, default=None))
