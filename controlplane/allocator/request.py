"""A job request resolved against its entitlement: the filters it implies, its preferences, and
which of the job's existing tasks stay where they are. Shared by the indexed allocator and the
full-scan reference (naive.py), so both mean the same thing by a request."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .errors import InvalidRequest
from .filters import (DcFilter, EntitlementFilter, Filter, FreeCpuFilter, FreeMemoryFilter,
                      CordonFilter, HealthyFilter, MachineTypeFilter, ReserveFilter)
from .model import Entitlement, JobRequest, Machine, MachineClaim, Placement, SoftPreference
from .snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Requirements:
    request: JobRequest
    entitlement: Entitlement
    machine_type: str
    dcs: tuple[DcFilter, ...]  # 0, 1 or 2 dc pins (request and entitlement)
    preferences: tuple[SoftPreference, ...]
    level: str  # the bins candidates are grouped in: fine enough for every preference

    def filters(self, allow_free: bool) -> tuple[Filter, ...]:
        r = self.request
        reserve = (ReserveFilter(self.entitlement.reserve),) if allow_free and self.entitlement.reserve else ()
        return (MachineTypeFilter(self.machine_type), HealthyFilter(), CordonFilter(), *self.dcs,
                EntitlementFilter(self.entitlement.name, allow_free), *reserve,
                FreeCpuFilter(r.cpus), FreeMemoryFilter(r.memory_mb))

    def dc_allows(self, dc: str) -> bool:
        return all(f.dc == dc for f in self.dcs)


def resolve(snapshot: Snapshot, request: JobRequest) -> Requirements:
    ent = snapshot.entitlements.get(request.entitlement)
    if ent is None:
        raise InvalidRequest("job", f"unknown entitlement {request.entitlement!r} in {request.job}")
    machine_type = request.machine_type or ent.machine_type
    if machine_type != ent.machine_type:
        # The quota is a count of machines of one type; another type is not covered by it.
        raise InvalidRequest("machine_type", f"entitlement {ent.name} holds {ent.machine_type} "
                             f"machines, not {machine_type}")
    dcs: list[DcFilter] = []
    if request.dc is not None:
        dcs.append(DcFilter(request.dc))
    if ent.spread.pinned_dc is not None and ent.spread.pinned_dc != request.dc:
        dcs.append(DcFilter(ent.spread.pinned_dc, field="entitlement.spread.pinned_dc"))
    prefs = request.preferences if request.preferences is not None else ent.spread.preferences()
    level = "rack" if any(p.property == "rack" for p in prefs) else "msb"
    return Requirements(request, ent, machine_type, tuple(dcs), prefs, level)


def split_tasks(snapshot: Snapshot, req: Requirements) -> tuple[dict[int, str], list[int]]:
    """(tasks that stay: index -> machine id, indices to place). A task stays if it has the
    requested size and its machine still meets every requirement but free room (it holds its
    own room). Any other task is placed afresh; its old copy holds resources until stopped."""
    r = req.request
    keep = [f for f in req.filters(allow_free=False) if not f.resource and getattr(f, "keeps", True)]
    existing = snapshot.tasks_of(r.job)
    static = _Static(snapshot)
    kept: dict[int, str] = {}
    to_place: list[int] = []
    for i in range(r.count):
        if r.gaps and i in r.gaps:
            continue
        t = existing.get(i)
        m = snapshot.machines.get(t.machine_id) if t is not None else None
        if (m is not None and i not in r.replace and t.cpus == r.cpus and t.memory_mb == r.memory_mb
                and all(f.passes(m, static) for f in keep)):
            kept[i] = m.id
        else:
            to_place.append(i)
    return kept, to_place


class _Static:
    """The overlay with nothing placed yet: enough for the non-resource filters."""

    __slots__ = ("snapshot",)

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def owner(self, machine_id: str) -> str | None:
        return self.snapshot.machines[machine_id].entitlement


def build_placement(snapshot: Snapshot, req: Requirements, task_machines: list[str] | tuple[str, ...],
                    new_tasks: list[int]) -> Placement:
    """The Placement with, per machine that gets new tasks, what the commit must re-check."""
    r = req.request
    per_machine = Counter(task_machines[i] for i in new_tasks)
    claims = []
    taken = []
    for mid, n in per_machine.items():
        m: Machine = snapshot.machines[mid]
        free_c, free_mem = snapshot.free(mid)
        if m.entitlement is None:
            taken.append(mid)
        claims.append(MachineClaim(mid, m.version, round(n * r.cpus, 9), n * r.memory_mb, free_c, free_mem,
                                   m.entitlement is None))
    return Placement(r.job, req.entitlement.name, snapshot.revision, tuple(task_machines), tuple(new_tasks),
                     tuple(taken), tuple(claims), r.cpus, r.memory_mb)
