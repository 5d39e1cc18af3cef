"""From a job to the allocator's request, and from the allocator's placement back to task records:
the pure edges of placing a job (the allocator itself is pure too: controlplane/allocator/)."""

from __future__ import annotations

import time

from controlplane.allocator import JobRequest, Placement, SoftPreference
from controlplane.store.records import JobRec, TaskRec
from controlplane.store.state import RegionState
from controlplane.scheduler.txn import Change


def job_request(job: JobRec, replace: tuple[int, ...] = ()) -> JobRequest:
    """The allocator's request for a job; `replace`: tasks to move although their machine is fine
    (away from a machine in maintenance)."""
    cpus, mem = job.resources()
    prefs = None if job.preferences is None else tuple(
        SoftPreference(p.property, p.strategy, p.weight) for p in job.preferences)
    return JobRequest(job.handle, job.top, cpus, mem, machine_type=job.machine_type, dc=job.dc, preferences=prefs,
                      replace=replace, gaps=frozenset(job.gaps))


def new_tasks(state: RegionState, job: JobRec, placement: Placement,
              indices: tuple[int, ...]) -> list[tuple[TaskRec | None, TaskRec]]:
    """The task records a placement makes for tasks `indices`, beside the records they replace."""
    existing = state.tasks.get(job.handle, {})
    now = time.time()
    out = []
    for i in indices:
        mid = placement.machine_of(i)
        old = existing.get(i)
        why = f"moved from {old.machine}" if old is not None and old.machine and old.machine != mid else "placed"
        # on a machine whose profile is already the one it will want (the reconciler's own
        # test), the task starts in this commit: one transaction, not a second one to start it
        m = state.machines.get(mid)
        state_ = "starting" if m is not None and state.profile_ready(m, joining=job.entitlement) else "allocated"
        out.append((old, TaskRec(job.handle, i, job.spec_version, job.task, mid, state_, why, False, now)))
    return out


def placement_changes(state: RegionState, job: JobRec, placement: Placement, indices: tuple[int, ...],
                      deletes: tuple[TaskRec, ...] = ()) -> tuple[list[Change], set[str]]:
    """The task changes a placement makes for tasks `indices` (with `deletes` removed), and the
    free machines it takes."""
    made = set(placement.new_tasks)  # once: per index it made a job's placement quadratic in its size
    chosen = tuple(i for i in indices if i in made)
    changes: list[Change] = list(new_tasks(state, job, placement, chosen))
    changes += [(t, None) for t in deletes]
    taken = {placement.machine_of(i) for i in chosen} & set(placement.machines_taken)
    return changes, taken
