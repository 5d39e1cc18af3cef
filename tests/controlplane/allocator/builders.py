"""Small builders for allocator tests: make_machine(dc="dc1", msb="m3") and friends."""

from __future__ import annotations

from collections import Counter

from controlplane.allocator import Entitlement, JobRequest, Machine, Placement, Snapshot, SpreadPolicy


def make_machine(id: str, *, dc: str = "dc1", msb: str = "m1", rack: str = "r1", type: str = "sky",
                 cpus: float = 4.0, memory_mb: int = 8192, healthy: bool = True,
                 entitlement: str | None = None, version: int = 0, region: str = "reg") -> Machine:
    return Machine(id, region, dc, msb, rack, type, cpus, memory_mb, healthy, entitlement, version)


def make_entitlement(name: str = "ent", *, type: str = "sky", quota: int = 100, pinned_dc: str | None = None,
                     spread: tuple[str, ...] = ("dc", "msb"), reserve: int = 0) -> Entitlement:
    return Entitlement(name, type, quota, SpreadPolicy(spread, pinned_dc), reserve)


def job(name: str = "ent/job", count: int = 1, cpus: float = 1.0, memory_mb: int = 512, **kw) -> JobRequest:
    return JobRequest(name, count, cpus, memory_mb, **kw)


def snapshot(machines, *entitlements: Entitlement, tasks=()) -> Snapshot:
    return Snapshot.build(machines, entitlements or (make_entitlement(),), tasks)


def grid(dcs=1, msbs=3, racks=1, per_rack=2, **kw) -> list[Machine]:
    """dcs x msbs x racks x per_rack machines named d0-m1-r0-2 (sorting by name = by place)."""
    return [make_machine(f"d{d}-m{m}-r{r}-{i}", dc=f"dc{d}", msb=f"m{m}", rack=f"r{r}", **kw)
            for d in range(dcs) for m in range(msbs) for r in range(racks) for i in range(per_rack)]


def tasks_per(snap: Snapshot, placement: Placement, prop: str) -> Counter:
    """How many of the placement's tasks landed in each dc / msb / rack (bin path)."""
    return Counter(snap.machines[mid].path(prop) for mid in placement.task_machines)
