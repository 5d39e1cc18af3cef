"""The fleet at a glance (GET /v1/fleet, `twinectl fleet`, the fleet page): the region's machines
summed per cell (dc, msb, entitlement, host profile, machine type; or fewer of these, `by`), each
with what is held, healthy, in maintenance, reserved and used; the free pool by machine type and
dc; and per entitlement the largest task that still fits, which shows its fragmentation. Summed on
the server: an answer's size follows the cells, never the machines."""

from __future__ import annotations

import time
from typing import Sequence

from controlplane.store.state import RegionState
from controlplane.usage.book import cell_of
from controlplane.usage.region import RegionUsage, add_into

DIMENSIONS = ("dc", "msb", "entitlement", "profile", "type")  # a cell's, in order


def _in_maintenance(state: RegionState, now: float) -> set[str]:
    out = set()
    for mid in state.maintenance.machines():
        e = state.maintenance.of(mid, now)
        if e is not None and e.phase(now) == "in progress":
            out.add(mid)
    return out


def _fits(best: tuple[float, int], cpus: float, mem: int) -> tuple[float, int]:
    return max(best, (round(cpus, 3), mem))


def fleet(state: RegionState, usage: RegionUsage, by: Sequence[str] = DIMENSIONS, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    keep = [DIMENSIONS.index(d) for d in by]
    maintenance = _in_maintenance(state, now)
    rows: dict[tuple, list] = {}
    # machines, healthy, in maintenance, cpus, memory, reserved cpus, reserved memory
    pool: dict[tuple[str, str], list[int]] = {}
    largest: dict[str, tuple[float, int]] = {}
    pool_largest: dict[str, tuple[float, int]] = {}  # machine type -> the largest usable machine of the pool
    held: dict[str, int] = {}
    for m in state.machines.values():
        cell = cell_of(m)
        key = tuple(cell[i] for i in keep)
        r = rows.get(key)
        if r is None:
            r = rows[key] = [0, 0, 0, 0.0, 0, 0.0, 0]
        cpus, mem = float(m.capacity.get("cpus", 0)), int(m.capacity.get("memory_mb", 0))
        usable = m.healthy and m.id not in maintenance
        r[0] += 1
        r[1] += m.healthy
        r[2] += m.id in maintenance
        r[3] += cpus
        r[4] += mem
        r[5] += m.alloc_cpus
        r[6] += m.alloc_memory_mb
        if m.entitlement is None:
            p = pool.setdefault((cell[4], cell[0]), [0, 0])
            p[0] += 1
            p[1] += usable
            if usable:
                pool_largest[cell[4]] = _fits(pool_largest.get(cell[4], (0.0, 0)), cpus, mem)
        else:
            held[m.entitlement] = held.get(m.entitlement, 0) + 1
        if m.entitlement is not None and usable:
            largest[m.entitlement] = _fits(largest.get(m.entitlement, (0.0, 0)), cpus - m.alloc_cpus,
                                           mem - m.alloc_memory_mb)
    used: dict[tuple, list[int]] = {}
    for cell, figures in usage.cells().items():
        add_into(used, tuple(cell[i] for i in keep), figures)
    cells = []
    for key in sorted(rows.keys() | used.keys()):
        r = rows.get(key) or [0, 0, 0, 0.0, 0, 0.0, 0]
        u = used.get(key) or [0] * 7
        cells.append({**dict(zip(by, key)), "machines": r[0], "healthy": r[1], "maintenance": r[2],
                      "cpus": round(r[3], 3), "memory_mb": r[4],
                      "reserved": {"cpus": round(r[5], 3), "memory_mb": r[6]},
                      "used": {"cpus": u[0] / 1000, "memory_mb": u[1], "machines_reporting": u[5]},
                      "hosts_used": {"cpus": u[2] / 1000, "memory_mb": u[3],
                                     "power_w": u[4] / 1000 if u[6] else None, "machines_with_power": u[6]}})
    ents = {}
    for name, e in sorted(state.entitlements.items()):
        own = largest.get(name, (0.0, 0))
        n = held.get(name, 0)
        grow = pool_largest.get(e.machine_type) if n < e.quota else None  # it may take a machine of the pool
        best = max(own, grow) if grow is not None else own
        ents[name] = {"held": n, "quota": e.quota, "largest_task": {"cpus": best[0], "memory_mb": best[1]},
                      "largest_on_held": {"cpus": own[0], "memory_mb": own[1]}}
    return {"by": list(by), "cells": cells,
            "free_pool": [{"type": t, "dc": dc, "machines": n, "usable": ok} for (t, dc), (n, ok) in sorted(pool.items())],
            "entitlements": ents}

