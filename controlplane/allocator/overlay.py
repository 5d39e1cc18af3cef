"""Consume-after-pick: the snapshot seen through what this allocation has placed so far.

A small overlay (machines touched by this job) over the snapshot, which it never changes, so a job's later
tasks see its earlier ones without copying 100,000 machines."""

from __future__ import annotations

from .model import Machine
from .snapshot import Snapshot


class Overlay:
    __slots__ = ("snapshot", "entitlement", "consumed", "taken", "_touched_bins", "_pool")

    def __init__(self, snapshot: Snapshot, entitlement: str) -> None:
        self.snapshot = snapshot
        self.entitlement = entitlement
        self.consumed: dict[str, tuple[float, int]] = {}  # machine id -> taken by this allocation
        self.taken: list[str] = []  # free machines this allocation moves into the entitlement
        self._touched_bins: dict[tuple[str, ...], list[str]] = {}  # bin path -> touched machine ids
        self._pool: dict[tuple[str, str], int] = {}  # (machine type, dc) -> free machines left (pool_left)

    def free(self, machine_id: str) -> tuple[float, int]:
        c, mem = self.snapshot.free(machine_id)
        used = self.consumed.get(machine_id)
        if used is None:
            return c, mem
        return round(c - used[0], 9), mem - used[1]

    def owner(self, machine_id: str) -> str | None:
        owner = self.snapshot.machines[machine_id].entitlement
        if owner is None and machine_id in self.consumed:
            return self.entitlement  # a free machine gets its first task only by being taken
        return owner

    def held(self) -> int:
        """Machines the entitlement holds, counting the ones this allocation takes."""
        return self.snapshot.held(self.entitlement) + len(self.taken)

    def pool_left(self, machine_type: str, dc: str) -> int:
        """Free machines of the type in the dc that take tasks (healthy, not cordoned), less the
        ones this allocation takes: what an entitlement's reserve is measured against."""
        n = self._pool.get((machine_type, dc))
        if n is None:  # counted once an allocation, then kept as it takes machines (consume)
            machines = self.snapshot.machines
            n = self._pool[(machine_type, dc)] = (
                sum(len(b) for p, b in self.snapshot.index.bins("msb", machine_type, None).items() if p[1] == dc)
                - sum(1 for mid in self.taken if machines[mid].dc == dc and machines[mid].machine_type == machine_type))
        return n

    def consume(self, machine: Machine, cpus: float, memory_mb: int, path: tuple[str, ...]) -> None:
        """Place one task on `machine`; `path` is its bin, so bins can list what was touched."""
        c, mem = self.consumed.get(machine.id, (0.0, 0))
        if machine.id not in self.consumed:
            self._touched_bins.setdefault(path, []).append(machine.id)
            if machine.entitlement is None:
                self.taken.append(machine.id)
                if (key := (machine.machine_type, machine.dc)) in self._pool:
                    self._pool[key] -= 1
        self.consumed[machine.id] = (round(c + cpus, 9), mem + memory_mb)

    def touched_in(self, path: tuple[str, ...]) -> list[str]:
        return self._touched_bins.get(path, [])
