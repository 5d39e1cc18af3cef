"""The region's machines summed as they change (issue #38): per fleet cell (dc, msb, entitlement,
host profile, machine type), the free pool per (machine type, dc), the machines each entitlement
holds, and the region's counts the metrics give. RegionState applies every machine record it
reads, at start and from the watch, here too (`change(old, new)`: the old record's part taken
out, the new one's put in), so that the fleet's answers and a Prometheus scrape cost the cells,
never a pass over a million machines.

What depends on the clock rather than on a record (a maintenance in progress) is not kept here:
the few machines under maintenance are counted when asked (usage/fleet.py). Resources are kept
in millicores and MiB, as integers: a sum kept by adding and taking away never drifts. What a
machine's tasks hold is not in its record: RegionState keeps it (`held`, micro-cores and MiB) and
says each change of it here (`hold`), and a record's change with what its tasks hold then."""

from __future__ import annotations

from controlplane.usage.book import Cell, cell_of

# a cell's row: machines, healthy, millicores, MiB, reserved millicores, reserved MiB, with tombstones
MACHINES, HEALTHY, CPU_M, MEMORY_MB, RESERVED_CPU_M, RESERVED_MB, TOMBSTONED = range(7)


def millicores(cpus) -> int:
    return int(round(float(cpus) * 1000))


def micro(cpus) -> int:
    """Cores in millionths, as an integer: what a machine's tasks hold is summed in these."""
    return int(round(float(cpus) * 1_000_000))


Held = tuple[int, int]  # what a machine's tasks hold: micro-cores, MiB
NOTHING: Held = (0, 0)


def holding(m, held: Held) -> Held:
    """What machine `m` holds (micro-cores, MiB): what its tasks hold (`held`) and its tombstones."""
    cpu_u, mb = held
    for t in m.tombstones:
        cpu_u += micro(t[2])
        mb += t[3]
    return cpu_u, mb


def reserved(m, held: Held) -> tuple[int, int]:
    """The machine's reserved millicores and MiB (holding())."""
    cpu_u, mb = holding(m, held)
    return (cpu_u + 500) // 1000, mb


class Cells:
    __slots__ = ("rows", "pool", "held", "capacity")

    def __init__(self) -> None:
        self.rows: dict[Cell, list[int]] = {}
        self.pool: dict[tuple[str, str], list[int]] = {}  # (machine type, dc) -> [free machines, healthy]
        self.held: dict[str, int] = {}  # entitlement -> machines it holds
        self.capacity: dict[str, tuple[float, int]] = {}  # machine type -> a machine's cpus and MiB (the first seen)

    def change(self, old, new, held: Held = NOTHING) -> None:
        """A machine record replaced (None: absent before, or gone); `held`: what its tasks hold."""
        if old is not None and new is not None and old.labels is new.labels and old.capacity is new.capacity \
                and old.entitlement == new.entitlement and old.profile_applied == new.profile_applied \
                and old.healthy == new.healthy and old.tombstones == new.tombstones:
            return  # in the same cell, counted alike (a heartbeat's address, a health reason's words)
        if old is not None:
            self._add(old, -1, held)
        if new is not None:
            self._add(new, 1, held)

    def hold(self, m, was: Held, now: Held) -> None:
        """What the tasks on machine `m` (its record, counted here) hold changed from `was` to `now`."""
        r = self.rows.get(cell_of(m))
        if r is not None:
            if m.tombstones:
                was, now = holding(m, was), holding(m, now)
            r[RESERVED_CPU_M] += (now[0] + 500) // 1000 - (was[0] + 500) // 1000  # (as reserved() rounds)
            r[RESERVED_MB] += now[1] - was[1]

    def _add(self, m, k: int, held: Held) -> None:
        cell = cell_of(m)
        r = self.rows.get(cell)
        if r is None:
            r = self.rows[cell] = [0] * 7
        cap = m.capacity
        r[MACHINES] += k
        r[HEALTHY] += k * m.healthy
        r[CPU_M] += k * millicores(cap.get("cpus", 0))
        r[MEMORY_MB] += k * int(cap.get("memory_mb", 0))
        cpu_m, mb = reserved(m, held)
        r[RESERVED_CPU_M] += k * cpu_m
        r[RESERVED_MB] += k * mb
        r[TOMBSTONED] += k * bool(m.tombstones)
        if not r[MACHINES]:
            del self.rows[cell]
        if m.entitlement is None:
            key = (cell[4], cell[0])
            p = self.pool.get(key)
            if p is None:
                p = self.pool[key] = [0, 0]
            p[0] += k
            p[1] += k * m.healthy
            if not p[0]:
                del self.pool[key]
        else:
            n = self.held.get(m.entitlement, 0) + k
            if n:
                self.held[m.entitlement] = n
            else:
                del self.held[m.entitlement]
        if k > 0 and cell[4] not in self.capacity and cap.get("cpus"):
            self.capacity[cell[4]] = (float(cap["cpus"]), int(cap.get("memory_mb", 0)))

    def total(self, i: int) -> int:
        """Figure `i` of every cell, summed (a pass over the cells)."""
        return sum(r[i] for r in self.rows.values())
