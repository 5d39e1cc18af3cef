"""The fleet at a glance (GET /v1/fleet, `twinectl fleet`, the fleet page): the region's machines
summed per cell (dc, msb, entitlement, host profile, machine type; or fewer of these, `by`), each
with what is held, healthy, in maintenance, reserved and used; the free pool by machine type and
dc; and per entitlement the largest task that still fits, which shows its fragmentation. Summed on
the server: an answer's size follows the cells, never the machines.

An answer costs the cells, not the machines (issue #38): the machines' sums are kept as their
records change (store/cells.py); the machines in a maintenance in progress, a clock's matter, are
counted when asked (the calendar's few); the largest task that fits is read off the allocator's
index (the best-fitting end of each of the entitlement's msb bins: machines that take tasks)."""

from __future__ import annotations

import time
from typing import Sequence

from controlplane.allocator.index import MachineIndex
from controlplane.store.cells import CPU_M, HEALTHY, MACHINES, MEMORY_MB, RESERVED_CPU_M, RESERVED_MB
from controlplane.store.records import MachineRec
from controlplane.store.state import RegionState
from controlplane.usage.book import cell_of
from controlplane.usage.region import RegionUsage, add_into

DIMENSIONS = ("dc", "msb", "entitlement", "profile", "type")  # a cell's, in order


def in_maintenance(state: RegionState, now: float) -> list[MachineRec]:
    """The machines in a maintenance in progress (of those the calendar covers)."""
    out = []
    for mid in state.maintenance.machines():
        e = state.maintenance.of(mid, now)
        if e is not None and e.phase(now) == "in progress" and (m := state.machines.get(mid)) is not None:
            out.append(m)
    return out


def largest(index: MachineIndex, machine_type: str, owner: str | None) -> tuple[float, int]:
    """The most free (cpus, MiB) on one machine of the type the owner holds (None: the free pool)
    that takes tasks: the top of each of its msb bins in the allocator's index."""
    best = (0.0, 0)
    for b in index.bins("msb", machine_type, owner).values():
        c, mem, _ = b[-1]
        best = max(best, (round(c, 3), mem))
    return best


def pool(state: RegionState, maintenance: list[MachineRec]) -> dict[tuple[str, str], list[int]]:
    """(machine type, dc) -> [free machines, usable: healthy and in no maintenance in progress]."""
    out = {key: list(p) for key, p in state.cells.pool.items()}
    for m in maintenance:
        if m.entitlement is None and m.healthy:
            out[(m.labels.get("machine_type", ""), m.labels.get("dc", ""))][1] -= 1
    return out


def answer(state: RegionState, usage: RegionUsage, by: Sequence[str] = DIMENSIONS, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    by, keep = tuple(by), [DIMENSIONS.index(d) for d in by]
    rows: dict[tuple, list[int]] = {}
    for cell, r in state.cells.rows.items():
        add_into(rows, tuple(cell[i] for i in keep), r)
    maintenance = in_maintenance(state, now)
    held: dict[tuple, int] = {}
    for m in maintenance:
        key = tuple(cell_of(m)[i] for i in keep)
        held[key] = held.get(key, 0) + 1
    used: dict[tuple, list[int]] = {}
    for cell, figures in usage.cells().items():
        add_into(used, tuple(cell[i] for i in keep), figures)
    cells = []
    for key in sorted(rows.keys() | used.keys()):
        r = rows.get(key) or [0] * 7
        u = used.get(key) or [0] * 7
        cells.append({**dict(zip(by, key)), "machines": r[MACHINES], "healthy": r[HEALTHY],
                      "maintenance": held.get(key, 0), "cpus": r[CPU_M] / 1000, "memory_mb": r[MEMORY_MB],
                      "reserved": {"cpus": r[RESERVED_CPU_M] / 1000, "memory_mb": r[RESERVED_MB]},
                      "used": {"cpus": u[0] / 1000, "memory_mb": u[1], "machines_reporting": u[5]},
                      "hosts_used": {"cpus": u[2] / 1000, "memory_mb": u[3],
                                     "power_w": u[4] / 1000 if u[6] else None, "machines_with_power": u[6]}})
    ents = {}
    pool_largest: dict[str, tuple[float, int]] = {}
    index = state.snapshot().index
    for name, e in sorted(state.entitlements.items()):
        own = largest(index, e.machine_type, name)
        n = state.cells.held.get(name, 0)
        if n < e.quota and e.machine_type not in pool_largest:
            pool_largest[e.machine_type] = largest(index, e.machine_type, None)
        grow = pool_largest.get(e.machine_type) if n < e.quota else None  # it may take a machine of the pool
        best = max(own, grow) if grow is not None else own
        ents[name] = {"held": n, "quota": e.quota, "largest_task": {"cpus": best[0], "memory_mb": best[1]},
                      "largest_on_held": {"cpus": own[0], "memory_mb": own[1]}}
    return {"by": list(by), "cells": cells,
            "free_pool": [{"type": ty, "dc": dc, "machines": n, "usable": ok}
                          for (ty, dc), (n, ok) in sorted(pool(state, maintenance).items())],
            "entitlements": ents}

