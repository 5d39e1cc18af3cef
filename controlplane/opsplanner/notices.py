"""What a job hears of planned maintenance: the maintenance that governs each of its tasks'
machines (the reconciler's `Maintenance`), and the advance notices its TaskController is sent
(paper Figure 8: `advanceNotices`) until each maintenance's deadline."""

from __future__ import annotations

from typing import Container, Mapping

from controlplane.opsplanner.maintenance import Calendar
from controlplane.scheduler.reconcile import Maintenance
from controlplane.store.records import TaskRec

MAINTENANCE_GRACE = 120.0  # seconds after a maintenance for its silent machines to come back


def governing(calendar: Calendar, mid: str, healthy: bool, now: float, default_policy: str) -> Maintenance | None:
    """The maintenance that governs the machine now, as the reconciler sees it; `default_policy`
    for jobs without a TaskController when the maintenance names none."""
    e = calendar.of(mid, now)
    until = None if e is None else e.until
    if e is None and not healthy:
        # Still down when its maintenance ended (powered off for the work, say): a grace to come
        # back before its suspended tasks count as lost and move.
        e = calendar.just_over(mid, now, MAINTENANCE_GRACE)
        until = None if e is None else e.until + MAINTENANCE_GRACE
    return None if e is None else Maintenance(e.id, now >= e.due, e.due, until, e.policy or default_policy)


def advance_notices(calendar: Calendar, tasks: Mapping[int, TaskRec], live: int | Container[int],
                    now: float) -> list[dict]:
    """Advance notices for a job: each maintenance not over that covers a machine one of its
    tasks (`live`: JobRec.live_set, or a count n: 0..n-1) holds, with the tasks it affects."""
    live = range(live) if isinstance(live, int) else live
    out = []
    for e in calendar.open(now):
        hit = sorted(i for i, t in tasks.items() if i in live and t.machine in e.machines)
        if hit:
            out.append({"id": e.id, "machines": sorted({tasks[i].machine for i in hit}), "start": e.start,
                        "deadline": e.due, "duration": e.duration, "end": e.until,
                        "phase": e.phase(now), "reason": e.reason, "tasks": hit})
    return out
