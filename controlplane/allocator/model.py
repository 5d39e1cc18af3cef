"""Domain values the allocator reads and returns. All frozen: a snapshot is shared between
concurrent allocations, and a Placement is handed to the caller's commit transaction unchanged."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import InvalidRequest

# Machine properties a soft preference may bin by, coarse to fine. A bin is the path down to the
# level, so "msb" bins are (region, dc, msb): msb names need only be unique within their dc.
LEVELS = ("region", "dc", "msb", "rack")
STRATEGIES = ("spread", "pack")
# cpus are floats; a sum of task sizes must not miss an exact fit by a rounding error.
EPSILON = 1e-9


def tasks_fit(cpus: float, memory_mb: int, task_cpus: float, task_memory_mb: int) -> int:
    """Tasks of one size that `cpus` and `memory_mb` hold (a machine's capacity, or what it has free)."""
    by_cpu = int(cpus / task_cpus + EPSILON) if task_cpus > 0 else 10**9
    return max(0, min(by_cpu, memory_mb // task_memory_mb if task_memory_mb else 10**9))


@dataclass(frozen=True, slots=True)
class Machine:
    id: str
    region: str
    dc: str
    msb: str  # main switchboard: the fault domain
    rack: str
    machine_type: str
    cpus: float  # capacity
    memory_mb: int  # capacity
    healthy: bool = True
    entitlement: str | None = None  # None: in the region's free pool
    version: int = 0  # mod revision of the machine's record; the caller's commit guard
    cordoned: bool = False  # in (or scheduled for) maintenance, or a profile switch: its tasks stay, it takes no new ones

    @property
    def schedulable(self) -> bool:
        return self.healthy and not self.cordoned

    def path(self, level: str) -> tuple[str, ...]:
        full = (self.region, self.dc, self.msb, self.rack)
        return full[: LEVELS.index(level) + 1]


@dataclass(frozen=True, slots=True)
class SoftPreference:
    """A machine property that bins machines, and how to spread tasks over the bins. The raw
    score per bin is normalised over the candidate bins and multiplied by `weight` (Nova)."""

    property: str = "msb"
    strategy: str = "spread"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.property not in LEVELS:
            raise InvalidRequest("preferences.property", f"{self.property!r} is not one of {LEVELS}")
        if self.strategy not in STRATEGIES:
            raise InvalidRequest("preferences.strategy", f"{self.strategy!r} is not one of {STRATEGIES}")
        if not 0 <= self.weight < math.inf:
            raise InvalidRequest("preferences.weight", f"{self.weight!r} must be a finite number >= 0")


@dataclass(frozen=True, slots=True)
class SpreadPolicy:
    """An entitlement's default for its jobs: spread over dc and msb, optionally pinned to a dc."""

    properties: tuple[str, ...] = ("dc", "msb")
    pinned_dc: str | None = None

    def preferences(self) -> tuple[SoftPreference, ...]:
        return tuple(SoftPreference(p, "spread") for p in self.properties)


@dataclass(frozen=True, slots=True)
class Entitlement:
    name: str
    machine_type: str
    quota: int  # at most this many machines
    spread: SpreadPolicy = SpreadPolicy()
    # free machines of its type it leaves in each dc (an opportunistic entitlement: the region's
    # reserve, kept for guaranteed growth while reclaims with notice refill it; docs/api.md)
    reserve: int = 0


@dataclass(frozen=True, slots=True)
class PlacedTask:
    """A task that holds resources on a machine (allocated, starting, running or stopping)."""

    job: str
    index: int
    machine_id: str
    cpus: float
    memory_mb: int


@dataclass(frozen=True, slots=True)
class JobRequest:
    """Where should tasks 0..count-1 of `job` (but `gaps`) run? Tasks already on a machine that
    still meets the hard requirements stay there; the others are placed."""

    job: str  # "<entitlement>/<name>"
    count: int
    cpus: float  # per task
    memory_mb: int  # per task
    machine_type: str | None = None  # None: the entitlement's machine type
    dc: str | None = None  # a hard dc requirement on top of the entitlement's pin
    preferences: tuple[SoftPreference, ...] | None = None  # None: the entitlement's spread policy
    replace: tuple[int, ...] = ()  # tasks to place afresh although their machine is fine (a move)
    gaps: frozenset[int] = frozenset()  # indices below count that are not the job's (JobRec.gaps)

    def __post_init__(self) -> None:
        ent, sep, name = self.job.partition("/")
        if not (sep and ent and name) or "/" in name:
            raise InvalidRequest("job", f"{self.job!r} is not '<entitlement>/<name>'")
        if not isinstance(self.count, int) or self.count < 0:
            raise InvalidRequest("count", f"{self.count!r} must be an integer >= 0")
        if not self.cpus > 0:
            raise InvalidRequest("cpus", f"{self.cpus!r} must be > 0")
        if not isinstance(self.memory_mb, int) or self.memory_mb < 0:
            raise InvalidRequest("memory_mb", f"{self.memory_mb!r} must be an integer >= 0")
        if self.preferences is not None and not isinstance(self.preferences, tuple):
            object.__setattr__(self, "preferences", tuple(self.preferences))

    @property
    def entitlement(self) -> str:
        return self.job.partition("/")[0]


@dataclass(frozen=True, slots=True)
class MachineClaim:
    """What the commit transaction must verify for one machine that receives new tasks: it is
    still at `version` (or at least still has `free_*` >= the required amounts), and, if `taken`,
    still free so the entitlement can take it."""

    machine_id: str
    version: int  # the machine version this placement read
    cpus: float  # required by the new tasks
    memory_mb: int
    free_cpus: float  # free before this placement, as read from the snapshot
    free_memory_mb: int
    taken: bool  # a free-pool machine the entitlement takes


@dataclass(frozen=True, slots=True)
class Placement:
    job: str
    entitlement: str
    snapshot_revision: int
    task_machines: tuple[str, ...]  # machine id per task index 0..count-1
    new_tasks: tuple[int, ...]  # indices placed by this allocation; the others stay where they are
    machines_taken: tuple[str, ...]  # free machines the entitlement must take, in pick order
    claims: tuple[MachineClaim, ...]  # one per machine that receives new tasks
    cpus: float  # per task
    memory_mb: int  # per task

    def machine_of(self, index: int) -> str:
        return self.task_machines[index]
