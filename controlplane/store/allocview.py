"""Records as the allocator sees them: machines, entitlements, placed tasks (and a moving task's
copy), for RegionState's snapshot (AllocatorView) and for what-if snapshots (capacity/reclaim.py).

The region's snapshot keeps no object a machine (issue #38): its machines are read off their
records when the allocator asks for one (LiveMachines, about 2 us a machine; an allocation of 36
tasks reads a few dozen). A copy of each as the allocator's Machine, and the dict of them, was 170
bytes a machine in every process: 0.63 GiB of the region bench's four processes at a million
machines. The index of machines that take tasks (allocator/index.py) is kept as before."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterator, MutableMapping
from typing import Any, Iterable, Protocol

from controlplane.allocator import Entitlement, Machine, PlacedTask, Snapshot, SpreadPolicy
from controlplane.rollouts.record import stopping
from controlplane.store.records import EntitlementRec, MachineRec, TaskRec


class Region(Protocol):
    """What the view reads of the region's state (store/state.py RegionState, which owns the view:
    named here by its shape, not imported, so that neither module imports the other)."""
    machines: dict[str, MachineRec]
    entitlements: dict[str, EntitlementRec]
    tasks: dict[str, dict[int, TaskRec]]
    revs: Any  # store/revisions.py Revisions
    maintenance: Any  # opsplanner/maintenance.py Calendar
    reclaims: Any  # capacity/index.py Reclaims
    rollouts: dict[str, Any]
    revision: int

    @property
    def reserve(self) -> int: ...


_CORES: dict[float, float] = {}  # each machine size's cores as one float (a float a machine: 24 bytes at 1M)


def to_machine(m: MachineRec, version: int, cordoned: bool = False) -> Machine:
    """The allocator's machine. One under (or scheduled for) maintenance is cordoned: it takes no
    new tasks, and the tasks on it stay unless the scheduler asks to place them afresh (a move)."""
    lb = m.labels
    cpus = float(m.capacity["cpus"])
    if len(_CORES) < 1000:
        cpus = _CORES.setdefault(cpus, cpus)
    return Machine(m.id, lb["region"], lb["dc"], lb["msb"], lb["rack"], lb["machine_type"],
                   cpus, int(m.capacity["memory_mb"]), m.healthy, m.entitlement, version, cordoned)


def to_entitlement(e: EntitlementRec, reserve: int = 0) -> Entitlement:
    """The allocator's entitlement; an opportunistic one leaves `reserve` free machines of its type
    in each dc (the region's reserve: `twinectl capacity reserve`)."""
    return Entitlement(e.name, e.machine_type, e.quota, SpreadPolicy(e.spread.properties, e.spread.pinned_dc),
                       reserve if e.kind == "opportunistic" else 0)


def to_placed(t: TaskRec) -> PlacedTask | None:
    if t.machine is None:
        return None
    cpus, mem = t.resources
    return PlacedTask(t.job, t.index, t.machine, cpus, mem)


# The allocator's snapshot holds a moving task's copy (TaskRec.moving) as a task of its own, of a
# job name no job can have (not a NAME): what it reserves on the machine it moves to is counted,
# and no allocation of the job sees it among the job's tasks.
MOVING = "#moving"
RECENT = 1024  # machines made from their records kept for the next read (LiveMachines.recent)


def to_placed_copy(t: TaskRec) -> PlacedTask | None:
    if t.moving is None:
        return None
    cpus, mem = t.resources
    return PlacedTask(t.job + MOVING, t.index, t.moving.machine, cpus, mem)


class LiveMachines(MutableMapping):
    """The region's machines as the allocator's, each made from its record when read. A machine
    the snapshot changed ahead of its commit (a batch of creates: apply_placement) is held as
    changed (`ahead`) until the view reads its record again (AllocatorView.snapshot).

    The last RECENT machines made are kept (`recent`, emptied when full), each until its record,
    revision or cordon changes (AllocatorView.changing): an allocation reads the same few dozen
    machines again and again (each filter, the scorer, the placement's build), and making each
    anew was a sixth of the daemon's commit path (bench_commit (2), py-spy)."""

    __slots__ = ("records", "versions", "view", "ahead", "recent")

    def __init__(self, records: dict[str, MachineRec], versions: dict[str, int], view: "AllocatorView"):
        self.records, self.versions, self.view = records, versions, view
        self.ahead: dict[str, Machine] = {}
        self.recent: dict[str, Machine] = {}

    def __getitem__(self, mid: str) -> Machine:
        m = self.ahead.get(mid) or self.recent.get(mid)
        if m is not None:
            return m
        m = to_machine(self.records[mid], self.versions[mid], mid in self.view.cordoned)
        if len(self.recent) >= RECENT:
            self.recent = {}  # (a new dict: a cleared one keeps the table it grew to)
        self.recent[mid] = m
        return m

    def __setitem__(self, mid: str, m: Machine) -> None:
        self.ahead[mid] = m

    def __delitem__(self, mid: str) -> None:
        self.ahead.pop(mid, None)

    def __contains__(self, mid: object) -> bool:
        return mid in self.records

    def __iter__(self) -> Iterator[str]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


class AllocatorView:
    """RegionState's allocator snapshot, moved forward by the changes since it was last asked for.
    The state tells it of each machine before the machine's record changes (`changing`), of each
    task and entitlement after (`tasks`, `ents`)."""

    def __init__(self, state: Region):
        self.state = state
        self.snap: Snapshot | None = None
        self.cordoned: set[str] = set()  # machines the snapshot has as taking no new task (refresh_cordons)
        self.machines = LiveMachines(state.machines, state.revs.machines, self)
        self.before: dict[str, Machine | None] = {}  # machines changed since the last snapshot -> as it had them
        self.tasks: set[tuple[str, int]] = set()
        self.ents: set[str] = set()

    def changing(self, mid: str) -> None:
        """The machine's record, revision or cordon is about to change."""
        if self.snap is not None and mid not in self.before:
            self.before[mid] = self.machines.get(mid)
        self.machines.recent.pop(mid, None)

    def refresh_cordons(self, now: float) -> None:
        """Cordoned: in (or scheduled for) maintenance, reclaimed, or draining or switching in a profile rollout."""
        st = self.state
        cordoned = {mid for mid in st.maintenance.machines() if mid in st.machines and st.maintenance.of(mid, now)}
        cordoned |= st.reclaims.cordoned(st.machines)
        cordoned |= {mid for r in st.rollouts.values() for mid in stopping(r) if mid in st.machines}
        for mid in cordoned ^ self.cordoned:
            self.changing(mid)
        self.cordoned = cordoned

    def snapshot(self) -> Snapshot:
        """RegionState.snapshot."""
        st = self.state
        self.refresh_cordons(time.time())
        reserve = st.reserve
        live = self.machines
        if self.snap is None:
            live.ahead.clear()
            self.snap = Snapshot.over(
                live, (to_entitlement(e, reserve) for e in st.entitlements.values()),
                itertools.chain((p for ts in st.tasks.values() for t in ts.values() if (p := to_placed(t)) is not None),
                                (to_placed_copy(t) for ts in st.tasks.values() for t in ts.values()
                                 if t.moving is not None)),
                st.revision)
            # The region as read at start lives long: out of the collector's full passes, which
            # would otherwise scan all of it (a pause that grows with the region). Freed as usual
            # when no longer referenced (records and snapshot hold no reference cycles).
            gc.freeze()
        elif self.before or self.tasks or self.ents:
            before = self.before
            for mid in before:
                live.ahead.pop(mid, None)  # read from its record again
            placed = {k: self._placed_one(k) for k in self.tasks}
            self.snap.apply(
                machines=[live[mid] for mid in before if mid in st.machines],
                removed_machines=[mid for mid in before if mid not in st.machines],
                tasks=[p for p in placed.values() if p is not None],
                removed_tasks=[k for k, p in placed.items() if p is None],
                entitlements=[to_entitlement(st.entitlements[n], reserve) for n in self.ents if n in st.entitlements],
                removed_entitlements=[n for n in self.ents if n not in st.entitlements],
                revision=st.revision, before=before)
            for mid in before:
                live.ahead.pop(mid, None)  # (apply stored them: they are their records)
        self.before = {}
        self.tasks.clear()
        self.ents.clear()
        return self.snap

    def reread(self, machines: Iterable[str], tasks: Iterable[tuple[str, int]]) -> None:
        """RegionState.reread."""
        for mid in machines:
            self.changing(mid)
        self.tasks.update(tasks)

    def _placed_one(self, key: tuple[str, int]) -> PlacedTask | None:
        st = self.state
        if key[0].endswith(MOVING):  # a moving task's copy: what it holds on the machine it moves to
            t = st.tasks.get(key[0][:-len(MOVING)], {}).get(key[1])
            return to_placed_copy(t) if t is not None else None
        t = st.tasks.get(key[0], {}).get(key[1])
        return to_placed(t) if t is not None else None
