"""The fleet at a glance (GET /v1/fleet, `twinectl fleet`, the fleet page): the region's machines
summed per cell (dc, msb, entitlement, host profile, machine type; or fewer of these, `by`), each
with what is held, healthy, in maintenance, reserved and used; the free pool by machine type and
dc; and per entitlement the largest task that still fits, which shows its fragmentation. Summed on
the server: an answer's size follows the cells, never the machines.

The pass over the machines (`tally`) gives the event loop back every CHUNK machines: at a million
machines it takes seconds, which the lease keep-alives and the heartbeats must not wait for. A
tally answers the requests that ask the same while it is made, and for twice as long as it took
after (none at a small region's few milliseconds, ~6 s at a million machines); the Prometheus
families read the last one, and a scrape begins the next when it is old (`Tallies.refresh`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Sequence

from controlplane.store.state import RegionState
from controlplane.usage.book import cell_of
from controlplane.usage.region import RegionUsage, add_into

DIMENSIONS = ("dc", "msb", "entitlement", "profile", "type")  # a cell's, in order
CHUNK = 5000  # machines between two yields to the event loop
ROW = 7  # machines, healthy, in maintenance, cpus, memory MiB, reserved cpus, reserved memory MiB


@dataclass
class Tally:
    """The machines summed once, as `by` groups them."""

    by: tuple[str, ...]
    at: float  # monotonic time it began
    took: float = 0.0  # seconds it took
    rows: dict[tuple, list] = field(default_factory=dict)
    pool: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (type, dc) -> machines, usable
    largest: dict[str, tuple[float, int]] = field(default_factory=dict)  # entitlement -> most free on one machine
    pool_largest: dict[str, tuple[float, int]] = field(default_factory=dict)  # type -> largest usable pool machine
    held: dict[str, int] = field(default_factory=dict)


def _in_maintenance(state: RegionState, now: float) -> set[str]:
    out = set()
    for mid in state.maintenance.machines():
        e = state.maintenance.of(mid, now)
        if e is not None and e.phase(now) == "in progress":
            out.add(mid)
    return out


def _fits(best: tuple[float, int], cpus: float, mem: int) -> tuple[float, int]:
    return max(best, (round(cpus, 3), mem))


async def tally(state: RegionState, by: Sequence[str], now: float | None = None) -> Tally:
    now = time.time() if now is None else now
    keep = [DIMENSIONS.index(d) for d in by]
    maintenance = _in_maintenance(state, now)
    t = Tally(tuple(by), time.monotonic())
    rows, pool, largest, pool_largest, held = t.rows, t.pool, t.largest, t.pool_largest, t.held
    machines = list(state.machines.values())  # as they are now: the view may change between chunks
    for start in range(0, len(machines), CHUNK):
        if start:
            await asyncio.sleep(0)
        for m in machines[start:start + CHUNK]:
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
                if usable:
                    largest[m.entitlement] = _fits(largest.get(m.entitlement, (0.0, 0)), cpus - m.alloc_cpus,
                                                   mem - m.alloc_memory_mb)
    t.took = time.monotonic() - t.at
    return t


class Tallies:
    """Tallies by `by`: one pass serves the requests that come while it runs, and after it for
    twice as long as it took."""

    def __init__(self, state: RegionState):
        self.state = state
        self._kept: dict[tuple[str, ...], Tally] = {}
        self._running: dict[tuple[str, ...], asyncio.Future] = {}

    async def get(self, by: Sequence[str]) -> Tally:
        by = tuple(by)
        kept = self._kept.get(by)
        if kept is not None and time.monotonic() - (kept.at + kept.took) < 2 * kept.took:
            return kept
        running = self._running.get(by)
        if running is None:
            running = self._running[by] = asyncio.ensure_future(tally(self.state, by))
            running.add_done_callback(lambda _: self._running.pop(by, None))
        t = await asyncio.shield(running)
        self._kept[by] = t
        return t

    def refresh(self, by: Sequence[str], most: float) -> Tally | None:
        """The last tally, and another begun in the background when that one is older than a
        second, or five times as long as it took, `most` seconds at most (what a scrape reads: a
        collector cannot wait). Nothing is summed while nobody asks."""
        by = tuple(by)
        kept = self._kept.get(by)
        if by not in self._running and (kept is None or time.monotonic() - kept.at > min(most, max(1.0, 5 * kept.took))):
            asyncio.ensure_future(self.get(by))
        return kept


def answer(state: RegionState, usage: RegionUsage, t: Tally) -> dict:
    by, keep = t.by, [DIMENSIONS.index(d) for d in t.by]
    used: dict[tuple, list[int]] = {}
    for cell, figures in usage.cells().items():
        add_into(used, tuple(cell[i] for i in keep), figures)
    cells = []
    for key in sorted(t.rows.keys() | used.keys()):
        r = t.rows.get(key) or [0, 0, 0, 0.0, 0, 0.0, 0]
        u = used.get(key) or [0] * 7
        cells.append({**dict(zip(by, key)), "machines": r[0], "healthy": r[1], "maintenance": r[2],
                      "cpus": round(r[3], 3), "memory_mb": r[4],
                      "reserved": {"cpus": round(r[5], 3), "memory_mb": r[6]},
                      "used": {"cpus": u[0] / 1000, "memory_mb": u[1], "machines_reporting": u[5]},
                      "hosts_used": {"cpus": u[2] / 1000, "memory_mb": u[3],
                                     "power_w": u[4] / 1000 if u[6] else None, "machines_with_power": u[6]}})
    ents = {}
    for name, e in sorted(state.entitlements.items()):
        own = t.largest.get(name, (0.0, 0))
        n = t.held.get(name, 0)
        grow = t.pool_largest.get(e.machine_type) if n < e.quota else None  # it may take a machine of the pool
        best = max(own, grow) if grow is not None else own
        ents[name] = {"held": n, "quota": e.quota, "largest_task": {"cpus": best[0], "memory_mb": best[1]},
                      "largest_on_held": {"cpus": own[0], "memory_mb": own[1]}}
    return {"by": list(by), "cells": cells,
            "free_pool": [{"type": ty, "dc": dc, "machines": n, "usable": ok}
                          for (ty, dc), (n, ok) in sorted(t.pool.items())],
            "entitlements": ents}


async def fleet(state: RegionState, usage: RegionUsage, by: Sequence[str] = DIMENSIONS,
                tallies: Tallies | None = None) -> dict:
    t = await (tallies.get(by) if tallies is not None else tally(state, by))
    return answer(state, usage, t)
