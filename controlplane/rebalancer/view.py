"""What the planner needs of the region, as plain values taken from the region's view at once (the
solver then runs on them in a thread, off the event loop)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Mapping

from controlplane.store.state import RegionState

SCALE = 1000  # cpus in millicores: CP-SAT takes integers


@dataclass
class Machine:
    id: str
    entitlement: str
    dc: str
    msb: str
    cpus: int  # millicores of capacity
    memory_mb: int
    fixed_cpus: int = 0  # held by what may not move: tasks not running, tombstones
    fixed_memory_mb: int = 0
    pinned: bool = False  # holds something that may not move: it cannot be freed
    rack: str = ""
    type: str = ""  # its machine type (a free machine an entitlement takes must be of the entitlement's)


@dataclass
class Task:
    job: str
    index: int
    machine: str
    cpus: int  # millicores reserved
    memory_mb: int
    keep_rack: bool = False  # its job spreads over racks: it moves within its rack only
    used: int = 0  # millicores measured: its own, or its job's mean while it has no figure of its own
    spreads_msb: bool = True  # its job spreads over MSBs: a move between MSBs must not make that worse


@dataclass
class Group:
    """One entitlement's machines in one MSB, and the running tasks on them."""

    entitlement: str
    dc: str
    msb: str
    machines: list[Machine] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)


@dataclass
class Region:
    """The groups to plan, and each MSB's capacity (every healthy machine's, free ones too: an
    MSB's load is what its machines use over what they have)."""

    groups: list[Group]
    msb_cpus: dict[tuple[str, str], int] = field(default_factory=dict)
    # for swaps (goal 4): the free pool's healthy machines in no maintenance (entitlement ""), each
    # entitlement's machine type and host profile, and per rack [machines, free ones] of the region
    pool: list[Machine] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, str | None] = field(default_factory=dict)
    racks: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.msb_cpus:
            for g in self.groups:
                key = (g.dc, g.msb)
                self.msb_cpus[key] = self.msb_cpus.get(key, 0) + sum(m.cpus for m in g.machines)


def region(state: RegionState, entitlements: Collection[str] | None = None,
           usage: Mapping[str, list[int]] | None = None, now: float | None = None,
           measured: Mapping[tuple[str, int, str], int] | None = None) -> Region:
    """The region's groups with each task's measured cpu (`measured`: (job, index, machine) -> its
    own millicores there; `usage`: RegionUsage.jobs(), per job [millicores, MiB, tasks], whose mean
    a task without a figure of its own is taken to use), and the MSBs' capacity."""
    now = time.time() if now is None else now
    gs = groups(state, entitlements, now, usage, measured)
    cap: dict[tuple[str, str], int] = {}
    pool, racks = [], {}
    for m in state.machines.values():
        rack = racks.setdefault(m.labels.get("rack", ""), [0, 0])
        rack[0] += 1
        if m.entitlement is None:
            rack[1] += 1
        if m.healthy:
            key = (m.labels.get("dc", ""), m.labels.get("msb", ""))
            cap[key] = cap.get(key, 0) + round(float(m.capacity.get("cpus", 0)) * SCALE)
            if m.entitlement is None and not m.tombstones and state.maintenance.of(m.id, now) is None:
                pool.append(Machine(m.id, "", key[0], key[1], round(float(m.capacity.get("cpus", 0)) * SCALE),
                                    int(m.capacity.get("memory_mb", 0)), rack=m.labels.get("rack", ""),
                                    type=m.labels.get("machine_type", "")))
    return Region(gs, cap, pool, {e.name: e.machine_type for e in state.entitlements.values()},
                  {e.name: e.profile for e in state.entitlements.values()}, racks)


def groups(state: RegionState, entitlements: Collection[str] | None = None, now: float | None = None,
           usage: Mapping[str, list[int]] | None = None,
           measured: Mapping[tuple[str, int, str], int] | None = None) -> list[Group]:
    """The (entitlement, MSB) groups of the entitlements' healthy machines that are in no
    maintenance, with the running tasks on them; an unhealthy machine or one in maintenance is
    left out whole (nothing moves to or from it)."""
    now = time.time() if now is None else now
    usage, measured = usage or {}, measured or {}
    out: dict[tuple[str, str, str], Group] = {}
    by_machine: dict[str, Machine] = {}
    for m in state.machines.values():
        if m.entitlement is None or (entitlements is not None and m.entitlement not in entitlements):
            continue
        if not m.healthy or state.maintenance.of(m.id, now) is not None:
            continue
        dc, msb = m.labels.get("dc", ""), m.labels.get("msb", "")
        mach = Machine(m.id, m.entitlement, dc, msb, round(float(m.capacity.get("cpus", 0)) * SCALE),
                       int(m.capacity.get("memory_mb", 0)), rack=m.labels.get("rack", ""),
                       type=m.labels.get("machine_type", ""))
        for _, _, cpus, mem, _ in m.tombstones:
            mach.fixed_cpus += round(cpus * SCALE)
            mach.fixed_memory_mb += int(mem)
            mach.pinned = True
        by_machine[m.id] = mach
        out.setdefault((m.entitlement, dc, msb), Group(m.entitlement, dc, msb)).machines.append(mach)
    # (a job's handle begins with its entitlement: the other entitlements' tasks are not read)
    handles = state.tasks if entitlements is None else \
        [h for h in state.tasks if h.partition("/")[0] in entitlements]
    for handle in handles:
        job, tasks = state.jobs.get(handle), state.tasks[handle]
        for t in tasks.values():
            cpus, mem = round(t.resources[0] * SCALE), t.resources[1]
            copy = by_machine.get(t.moving.machine) if t.moving is not None else None
            if copy is not None:  # moving (make-before-break): its copy holds the target too
                copy.fixed_cpus += cpus
                copy.fixed_memory_mb += mem
                copy.pinned = True
            mach = by_machine.get(t.machine) if t.machine else None
            if mach is None:
                continue
            if t.state != "running" or job is None or job.state != "active" or not job.live(t.index) \
                    or t.moving is not None:
                mach.fixed_cpus += cpus
                mach.fixed_memory_mb += mem
                mach.pinned = True
                continue
            ent = state.entitlements.get(job.entitlement)
            props = [p.property for p in job.preferences] if job.preferences is not None else \
                list(ent.spread.properties if ent is not None else ())
            # its own figure where it runs: a job's tasks differ (one serves the hot keys), and the
            # mean would spread a hot task's load over its job's machines, hiding the machine it heats;
            # the mean only for a task not measured yet (just placed, or its replica did not answer)
            used = measured.get((handle, t.index, mach.id))
            if used is None:
                mean = usage.get(handle)
                used = round(mean[0] / mean[2]) if mean and mean[2] else 0
            out[(mach.entitlement, mach.dc, mach.msb)].tasks.append(
                Task(handle, t.index, mach.id, cpus, mem, "rack" in props, used, "msb" in props))
    return [g for _, g in sorted(out.items())]
