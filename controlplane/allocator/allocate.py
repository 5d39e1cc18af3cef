"""The allocator: where should a job's tasks run? A pure function of a snapshot and a request.

For each task to place: among the bins (msbs, or racks) that hold a machine passing the hard
requirements, take the bin the soft preferences score best; within equally good bins the
entitlement's own machines come before the free pool (tasks of one entitlement stack on its
machines, and free machines are taken only when needed or when the spread asks for a bin the
entitlement has no room in); among those, the best fit (least free cpu, then memory, then id).
After each pick the overlay consumes the task, so the next task sees it (consume-after-pick).

The candidate bins and the pick live in candidates.py: a task costs a bisect in the bin it went
to and a score over a few dozen bins, not a pass over every machine.
"""

from __future__ import annotations

from collections.abc import Iterable

from .candidates import Candidates
from .errors import AllocationError, AllocatorInconsistency, NoPlacement, QuotaExceeded, ReserveKept
from .filters import Filter, count_survivors
from .model import JobRequest, Machine, Placement
from .preferences import BinCounts
from .request import Requirements, build_placement, resolve, split_tasks
from .snapshot import Snapshot
from .overlay import Overlay


def allocate(snapshot: Snapshot, request: JobRequest) -> Placement:
    """Place tasks 0..count-1 of `request.job`. Raises InvalidRequest, NoPlacement or
    QuotaExceeded (all AllocationError, each naming the request field at fault); and
    AllocatorInconsistency, a bug, should the index and the filters disagree."""
    return place(snapshot, resolve(snapshot, request))


def place(snapshot: Snapshot, req: Requirements) -> Placement:
    r = req.request
    kept, to_place = split_tasks(snapshot, req)
    overlay = Overlay(snapshot, req.entitlement.name)
    counts = BinCounts(req.preferences)
    task_machines = [""] * r.count
    for i, mid in kept.items():
        task_machines[i] = mid
        counts.add(snapshot.machines[mid])
    candidates = Candidates(snapshot, req, overlay, {snapshot.machines[mid].path(req.level) for mid in kept.values()},
                            counts)
    filters = req.filters(allow_free=True)
    for i in to_place:
        mid = candidates.pick()
        if mid is None:
            raise no_fit(snapshot, req, overlay, i)
        m = snapshot.machines[mid]
        if not all(f.passes(m, overlay) for f in filters):
            raise _refused(filters, m, overlay, r.job, i)
        path = m.path(req.level)
        overlay.consume(m, r.cpus, r.memory_mb, path)
        counts.add(m)
        candidates.after_pick(path)
        task_machines[i] = mid
    return build_placement(snapshot, req, task_machines, to_place)


def no_fit(snapshot: Snapshot, req: Requirements, overlay: Overlay, task: int) -> AllocationError:
    """Why task `task` has nowhere to go. The rare path, so it runs the filters over every
    machine and reports how many each left."""
    r, ent = req.request, req.entitlement
    total = len(snapshot.machines)
    machines = list(snapshot.machines.values())  # once: the region's are made from their records as read
    quota_open = overlay.held() < ent.quota
    if not quota_open:
        would_fit = count_survivors(req.filters(allow_free=True), machines, overlay, total)
        if would_fit[-1][1]:
            return QuotaExceeded(r.job, task, ent.name, ent.quota, overlay.held())
    filters = req.filters(allow_free=quota_open)
    survivors = count_survivors(filters, machines, overlay, total)
    if not survivors[-1][1] and quota_open and ent.reserve:
        without = tuple(f for f in filters if f.field != "reserve")
        if count_survivors(without, machines, overlay, total)[-1][1]:
            return ReserveKept(r.job, task, ent.name, ent.reserve)
    if survivors[-1][1]:
        raise _missed(filters, machines, overlay, r.job, task, survivors[-1][1])
    field = next(f.field for f, (_, left) in zip(filters, survivors[1:]) if left == 0)
    return NoPlacement(r.job, task, survivors, field)


def _refused(filters: tuple[Filter, ...], m: Machine, overlay: Overlay, job: str, task: int) -> AllocatorInconsistency:
    """The index picked `m` for `task`, and a filter refuses it."""
    refused = ", ".join(f"{f.name} ({f.field})" for f in filters if not f.passes(m, overlay))
    return AllocatorInconsistency(f"the allocator's index and its filters disagree: the index picked machine "
                                  f"{m.id} for task {task}, which the filters refuse: {refused}", job)


def _missed(filters: tuple[Filter, ...], machines: Iterable[Machine], overlay: Overlay, job: str, task: int,
            passing: int) -> AllocatorInconsistency:
    """The index found no machine for `task`, but `passing` machines pass every filter."""
    some = [m.id for m in machines if all(f.passes(m, overlay) for f in filters)][:3]
    return AllocatorInconsistency(f"the allocator's index and its filters disagree: the index found no machine "
                                  f"for task {task}, the filters pass {passing:,} (e.g. {', '.join(some)})", job)
