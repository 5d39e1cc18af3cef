"""An immutable view of the region for the allocator: machines, entitlements, the tasks that hold
resources, and the machine index. The caller builds one from its etcd-backed caches and derives the
next with `with_changes` as watch events arrive; concurrent allocations share one snapshot."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from .index import MachineIndex
from .model import Entitlement, Machine, Placement, PlacedTask

_NO_TASKS: Mapping[int, PlacedTask] = MappingProxyType({})


def _round(cpus: float) -> float:
    # Sums and differences of float cpus drift; nine decimals are far below any real task size.
    return round(cpus, 9)


class Snapshot:
    __slots__ = ("revision", "machines", "entitlements", "_machines", "_tasks", "_used", "index")

    def __init__(self, revision: int, machines: dict[str, Machine], entitlements: dict[str, Entitlement],
                 tasks: dict[str, dict[int, PlacedTask]], used: dict[str, tuple[float, int]],
                 index: MachineIndex | None = None) -> None:
        self.revision = revision
        self._machines = machines  # the dict itself: dict.copy() is far faster than copying a proxy
        self.machines: Mapping[str, Machine] = MappingProxyType(machines)
        self.entitlements: Mapping[str, Entitlement] = MappingProxyType(entitlements)
        self._tasks = tasks
        self._used = used
        self.index = index if index is not None else MachineIndex.build(machines.values(), self.free)

    @classmethod
    def build(cls, machines: Iterable[Machine], entitlements: Iterable[Entitlement] = (),
              tasks: Iterable[PlacedTask] = (), revision: int = 0) -> Snapshot:
        ms = {m.id: m for m in machines}
        by_job: dict[str, dict[int, PlacedTask]] = {}
        used: dict[str, tuple[float, int]] = {}
        for t in tasks:
            by_job.setdefault(t.job, {})[t.index] = t
            c, mem = used.get(t.machine_id, (0.0, 0))
            used[t.machine_id] = (_round(c + t.cpus), mem + t.memory_mb)
        return cls(revision, ms, {e.name: e for e in entitlements}, by_job, used)

    def used(self, machine_id: str) -> tuple[float, int]:
        return self._used.get(machine_id, (0.0, 0))

    def free(self, machine_id: str) -> tuple[float, int]:
        m = self.machines[machine_id]
        used = self._used.get(machine_id)
        if used is None:
            return m.cpus, m.memory_mb
        return _round(m.cpus - used[0]), m.memory_mb - used[1]

    def tasks_of(self, job: str) -> Mapping[int, PlacedTask]:
        tasks = self._tasks.get(job)
        return MappingProxyType(tasks) if tasks else _NO_TASKS

    def held(self, entitlement: str) -> int:
        """How many machines the entitlement holds (counted against its quota)."""
        return self.index.held(entitlement)

    def with_changes(self, *, machines: Iterable[Machine] = (), removed_machines: Iterable[str] = (),
                     tasks: Iterable[PlacedTask] = (), removed_tasks: Iterable[tuple[str, int]] = (),
                     entitlements: Iterable[Entitlement] = (), revision: int | None = None) -> Snapshot:
        """The next snapshot. `tasks` add or replace tasks by (job, index). Costs the touched
        machines' buckets plus a copy of the top-level dicts, not a rebuild of the index."""
        ms = self._machines.copy()
        used = self._used.copy()
        by_job = self._tasks.copy()
        touched: dict[str, Machine | None] = {}  # machine id -> the machine before this change

        def note(machine_id: str) -> None:
            if machine_id not in touched:
                touched[machine_id] = self.machines.get(machine_id)

        def add_use(machine_id: str, cpus: float, memory_mb: int) -> None:
            note(machine_id)
            c, mem = used.get(machine_id, (0.0, 0))
            used[machine_id] = (_round(c + cpus), mem + memory_mb)

        copied: set[str] = set()  # jobs whose task dict this snapshot owns (copy-on-write)

        def job_tasks(job: str) -> dict[int, PlacedTask]:
            if job not in copied:
                copied.add(job)
                by_job[job] = dict(by_job.get(job, {}))
            return by_job[job]

        def drop(job: str, index: int) -> None:
            old = by_job.get(job, {}).get(index)
            if old is not None:
                del job_tasks(job)[index]
                add_use(old.machine_id, -old.cpus, -old.memory_mb)

        for job, index in removed_tasks:
            drop(job, index)
        for t in tasks:
            drop(t.job, t.index)
            job_tasks(t.job)[t.index] = t
            add_use(t.machine_id, t.cpus, t.memory_mb)
        for job in copied:
            if not by_job[job]:
                del by_job[job]
        for machine_id in removed_machines:
            note(machine_id)
            ms.pop(machine_id, None)
        for m in machines:
            note(m.id)
            ms[m.id] = m
        ents = dict(self.entitlements)
        ents.update((e.name, e) for e in entitlements)
        nxt = Snapshot(self.revision + 1 if revision is None else revision, ms, ents, by_job, used,
                       index=self.index)
        changes = [(old, ms.get(mid)) for mid, old in touched.items() if old is not None or mid in ms]
        nxt.index = self.index.updated(changes, nxt.free)
        return nxt

    def with_placement(self, placement: Placement) -> Snapshot:
        """The snapshot after the caller committed `placement`: taken machines join the
        entitlement (their version bumped, as a write to their record would) and the new tasks
        hold resources. The real commit is the caller's etcd transaction; this is for tests and
        simulations."""
        moved = [replace(self.machines[mid], entitlement=placement.entitlement,
                         version=self.machines[mid].version + 1) for mid in placement.machines_taken]
        placed = [PlacedTask(placement.job, i, placement.task_machines[i], placement.cpus, placement.memory_mb)
                  for i in placement.new_tasks]
        return self.with_changes(machines=moved, tasks=placed)
