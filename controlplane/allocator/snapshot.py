"""The allocator's picture of the region: machines, entitlements, the tasks that hold resources, and
the machine index. The caller builds one from its etcd-backed caches and moves it forward in place
with `apply` as watch events arrive: a change costs the machines and tasks it touches, not the
region (DESIGN.md, "cost follows the change").

In place means one writer and no reader across a change. The owner (RegionState) applies changes
only when asked for the snapshot, and allocate() reads it synchronously, so an allocation never
sees a change half way; a caller must not keep the snapshot across an await. Tests and what-if
simulations that want the old and the new side by side use `with_changes`, which copies first.

Its machines are a dict of its own (`build`), or a mapping its owner keeps (`over`): RegionState's
reads each machine off its record when asked, so that no object a machine is kept for the
allocator (store/allocview.py). Such an owner says, when it moves the snapshot forward, what the
snapshot had of each changed machine before (`apply(before=)`), for the index to take it out of
its bins: the mapping has the new already."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import replace
from types import MappingProxyType

from .index import MachineIndex
from .model import Entitlement, Machine, Placement, PlacedTask

_NO_TASKS: Mapping[int, PlacedTask] = MappingProxyType({})


def _round(cpus: float) -> float:
    # Sums and differences of float cpus drift; nine decimals are far below any real task size.
    return round(cpus, 9)


class Snapshot:
    __slots__ = ("revision", "machines", "entitlements", "_machines", "_entitlements", "_tasks", "_used", "index")

    def __init__(self, revision: int, machines: MutableMapping[str, Machine], entitlements: dict[str, Entitlement],
                 tasks: dict[str, dict[int, PlacedTask]], used: dict[str, tuple[float, int]],
                 index: MachineIndex | None = None) -> None:
        self.revision = revision
        self._machines = machines  # the dict itself, changed in place; readers get the proxy
        self.machines: Mapping[str, Machine] = MappingProxyType(machines)
        self._entitlements = entitlements
        self.entitlements: Mapping[str, Entitlement] = MappingProxyType(entitlements)
        self._tasks = tasks
        self._used = used
        self.index = index if index is not None else MachineIndex.build(machines.values(), self.free)

    @classmethod
    def build(cls, machines: Iterable[Machine], entitlements: Iterable[Entitlement] = (),
              tasks: Iterable[PlacedTask] = (), revision: int = 0) -> Snapshot:
        return cls.over({m.id: m for m in machines}, entitlements, tasks, revision)

    @classmethod
    def over(cls, machines: MutableMapping[str, Machine], entitlements: Iterable[Entitlement] = (),
             tasks: Iterable[PlacedTask] = (), revision: int = 0) -> Snapshot:
        """A snapshot of the machines in `machines`, which it keeps (no copy) and changes in place
        as it is moved forward: a mapping its owner keeps in step (see apply's `before`)."""
        by_job: dict[str, dict[int, PlacedTask]] = {}
        used: dict[str, tuple[float, int]] = {}
        for t in tasks:
            by_job.setdefault(t.job, {})[t.index] = t
            c, mem = used.get(t.machine_id, (0.0, 0))
            used[t.machine_id] = (_round(c + t.cpus), mem + t.memory_mb)
        return cls(revision, machines, {e.name: e for e in entitlements}, by_job, used)

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

    def apply(self, *, machines: Iterable[Machine] = (), removed_machines: Iterable[str] = (),
              tasks: Iterable[PlacedTask] = (), removed_tasks: Iterable[tuple[str, int]] = (),
              entitlements: Iterable[Entitlement] = (), removed_entitlements: Iterable[str] = (),
              revision: int | None = None, before: Mapping[str, Machine | None] | None = None) -> Snapshot:
        """Move this snapshot forward in place and return it. `tasks` add or replace tasks by
        (job, index); `machines` add or replace machines by id. Costs the touched machines' bins
        and tasks: a bisect and an insort per bin, no copy of anything region-sized. `before`:
        what this snapshot had of machines whose change its machines mapping has already (an
        owner's mapping, `over`; None: a machine new to it); the others are read from it."""
        ms, used, by_job = self._machines, self._used, self._tasks
        touched: dict[str, Machine | None] = dict(before or {})  # machine id -> the machine before this change

        def add_use(machine_id: str, cpus: float, memory_mb: int) -> None:
            if machine_id not in touched:
                touched[machine_id] = ms.get(machine_id)
            c, mem = used.get(machine_id, (0.0, 0))
            c, mem = _round(c + cpus), mem + memory_mb
            if c == 0 and mem == 0:
                used.pop(machine_id, None)  # as a fresh build: no tasks, no entry
            else:
                used[machine_id] = (c, mem)

        def drop(job: str, index: int) -> None:
            held = by_job.get(job)
            old = held.pop(index, None) if held else None
            if old is not None:
                if not held:
                    del by_job[job]
                add_use(old.machine_id, -old.cpus, -old.memory_mb)

        for job, index in removed_tasks:
            drop(job, index)
        for t in tasks:
            held = by_job.get(t.job)
            if held is not None and held.get(t.index) == t:
                # what it holds already: a scheduler's own placement, applied when it committed
                # (apply_placement), coming back through the watch (issue #38: dropping and adding
                # it again touched its machine's bins for nothing, 4 % of a shard leader's CPU)
                continue
            drop(t.job, t.index)
            by_job.setdefault(t.job, {})[t.index] = t
            add_use(t.machine_id, t.cpus, t.memory_mb)
        for machine_id in removed_machines:
            if machine_id not in touched:
                touched[machine_id] = ms.get(machine_id)
            ms.pop(machine_id, None)
        for m in machines:
            if m.id not in touched:
                touched[m.id] = ms.get(m.id)
            ms[m.id] = m
        ents = self._entitlements
        for name in removed_entitlements:
            ents.pop(name, None)
        ents.update((e.name, e) for e in entitlements)
        self.revision = self.revision + 1 if revision is None else revision
        self.index.update([(old, ms.get(mid)) for mid, old in touched.items() if old is not None or mid in ms],
                          self.free)
        return self

    def apply_placement(self, placement: Placement) -> Snapshot:
        """Apply what committing `placement` changes: the free machines taken join the entitlement
        (their records written: version bumped), and the new tasks hold resources (the other
        machines' records are guarded, not written: what they hold is their tasks'). The real
        commit is the caller's etcd transaction, whose watch events RegionState applies; this is
        the same change for tests, simulations and benchmarks."""
        return self.apply(**self.placement_changes(placement))

    def placement_changes(self, placement: Placement) -> dict:
        """`apply`'s arguments for a committed placement."""
        taken = set(placement.machines_taken)
        moved = []
        for claim in placement.claims:
            if claim.machine_id in taken:
                m = self.machines[claim.machine_id]
                moved.append(replace(m, entitlement=placement.entitlement, version=m.version + 1))
        placed = [PlacedTask(placement.job, i, placement.task_machines[i], placement.cpus, placement.memory_mb)
                  for i in placement.new_tasks]
        return {"machines": moved, "tasks": placed}

    def copy(self) -> Snapshot:
        """An independent copy. Costs the region: for tests and what-if simulations, never per commit."""
        return Snapshot(self.revision, dict(self._machines), dict(self._entitlements),
                        {job: dict(ts) for job, ts in self._tasks.items()}, dict(self._used), self.index.copy())

    def with_changes(self, **changes) -> Snapshot:
        """A new snapshot with `apply`'s changes; this one stays as it was. Copies the region."""
        return self.copy().apply(**changes)

    def with_placement(self, placement: Placement) -> Snapshot:
        """A new snapshot after `placement` was committed; this one stays as it was. Copies the region."""
        return self.copy().apply_placement(placement)
