"""Records as the allocator sees them: machines, entitlements, placed tasks (and a moving task's
copy), for RegionState's snapshot and for what-if snapshots (capacity/reclaim.py)."""

from __future__ import annotations

from controlplane.allocator import Entitlement, Machine, PlacedTask, SpreadPolicy
from controlplane.store.records import EntitlementRec, MachineRec, TaskRec


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


def to_placed_copy(t: TaskRec) -> PlacedTask | None:
    if t.moving is None:
        return None
    cpus, mem = t.resources
    return PlacedTask(t.job + MOVING, t.index, t.moving.machine, cpus, mem)
