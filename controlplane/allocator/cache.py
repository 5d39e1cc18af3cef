"""The job-level allocation cache (paper 2.3): the last placement of each job, reused while the
request is the same and the machines it used have not changed.

A hit still re-checks, against the current snapshot, that each machine getting new tasks has room
and that the quota allows the free machines it takes: a few dozen look-ups instead of a placement.
A machine "has changed" when its placement properties differ (location, type, capacity, health);
a version bump alone, such as our own commit moving a free machine into the entitlement, does not
invalidate. The hit ratio is exposed through `stats()`."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from .model import EPSILON, Entitlement, JobRequest, Placement
from .request import Requirements, build_placement, split_tasks
from .snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    entries: int
    misses_by_reason: tuple[tuple[str, int], ...]  # new job, request changed, machine changed, ...

    @property
    def hit_ratio(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


@dataclass(frozen=True, slots=True)
class _Entry:
    request: JobRequest
    entitlement: Entitlement
    task_machines: tuple[str, ...]
    machines: tuple[tuple[str, int, tuple], ...]  # (id, version, placement properties) as used


class AllocationCache:
    """Shared by the allocations of one allocator shard; safe to use from several threads."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._max = max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses: dict[str, int] = {}

    def lookup(self, snapshot: Snapshot, req: Requirements) -> Placement | None:
        with self._lock:
            entry = self._entries.get(req.request.job)
        reason, placement = _validate(entry, snapshot, req)
        with self._lock:
            if placement is not None:
                self._hits += 1
                if req.request.job in self._entries:
                    self._entries.move_to_end(req.request.job)
            else:
                self._misses[reason] = self._misses.get(reason, 0) + 1
        return placement

    def store(self, snapshot: Snapshot, req: Requirements, placement: Placement) -> None:
        used = dict.fromkeys(placement.task_machines)
        entry = _Entry(req.request, req.entitlement, placement.task_machines,
                       tuple((mid, snapshot.machines[mid].version, snapshot.machines[mid].placement_properties())
                             for mid in used))
        with self._lock:
            self._entries[req.request.job] = entry
            self._entries.move_to_end(req.request.job)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def evict(self, job: str) -> None:
        """Forget a job's placement, e.g. once the job is stopped or its tasks deallocated."""
        with self._lock:
            self._entries.pop(job, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, sum(self._misses.values()), len(self._entries),
                              tuple(sorted(self._misses.items())))


def _validate(entry: _Entry | None, snapshot: Snapshot, req: Requirements) -> tuple[str, Placement | None]:
    if entry is None:
        return "new job", None
    if entry.request != req.request:
        return "request changed", None
    if entry.entitlement != req.entitlement:  # quota, machine type or spread policy
        return "entitlement changed", None
    machines = snapshot.machines
    for mid, version, props in entry.machines:
        m = machines.get(mid)
        # a version bump alone (our own commit took the machine) leaves the placement valid; a
        # property change does, with or without one (a cordon for maintenance writes no record)
        if m is None or m.placement_properties() != props:
            return "machine changed", None
    kept, to_place = split_tasks(snapshot, req)
    if any(entry.task_machines[i] != mid for i, mid in kept.items()):
        return "tasks moved", None
    ent = req.entitlement
    placement = build_placement(snapshot, req, entry.task_machines, to_place, cached=True)
    for claim in placement.claims:
        if machines[claim.machine_id].entitlement not in (None, ent.name):
            return "machine changed owner", None
        if claim.free_cpus < claim.cpus - EPSILON or claim.free_memory_mb < claim.memory_mb:
            return "no room", None
    if placement.machines_taken and snapshot.held(ent.name) + len(placement.machines_taken) > ent.quota:
        return "quota", None
    return "", placement
