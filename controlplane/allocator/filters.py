"""Hard requirements, one tiny predicate each (Nova filters). A filter removes machines; the
framework counts how many each filter left, which is what a "no placement" error reports.

The indexed allocator gets type, owner and health from the index structure and checks resources
while it scans a bin; these predicates are the definition it must agree with, used as such by the
full-scan reference, by the error report, and by a check on every pick."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from .model import EPSILON, Machine
from .overlay import Overlay


class Filter(Protocol):
    field: str  # the request field this requirement comes from, for a 4xx
    resource: bool  # checks free resources (a task already on the machine holds them)

    @property
    def name(self) -> str: ...

    def passes(self, machine: Machine, overlay: Overlay) -> bool: ...


@dataclass(frozen=True, slots=True)
class MachineTypeFilter:
    machine_type: str
    field: str = "machine_type"
    resource: bool = False

    @property
    def name(self) -> str:
        return f"type={self.machine_type}"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return machine.machine_type == self.machine_type


@dataclass(frozen=True, slots=True)
class HealthyFilter:
    field: str = "healthy"
    resource: bool = False

    @property
    def name(self) -> str:
        return "healthy"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return machine.healthy


@dataclass(frozen=True, slots=True)
class CordonFilter:
    """No new task on a cordoned machine: in (or scheduled for) maintenance, or in a profile
    rollout's switch; the tasks already there stay (`keeps` False: split_tasks does not move a task
    for it)."""

    field: str = "cordon"
    resource: bool = False
    keeps: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return "not cordoned"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return not machine.cordoned


@dataclass(frozen=True, slots=True)
class DcFilter:
    """The request's dc, or the entitlement's pinned dc (field says which)."""

    dc: str
    field: str = "dc"
    resource: bool = False

    @property
    def name(self) -> str:
        return f"dc={self.dc}"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return machine.dc == self.dc


@dataclass(frozen=True, slots=True)
class EntitlementFilter:
    """The entitlement's own machines, and the free pool while the quota allows taking more."""

    entitlement: str
    allow_free: bool
    field: str = "entitlement"
    resource: bool = False

    @property
    def name(self) -> str:
        if self.allow_free:
            return f"entitlement={self.entitlement} or free"
        return f"entitlement={self.entitlement} (quota reached)"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        owner = overlay.owner(machine.id)
        return owner == self.entitlement or (self.allow_free and owner is None)


@dataclass(frozen=True, slots=True)
class ReserveFilter:
    """A free machine only while more than `reserve` free machines of its type are left in its dc
    (an opportunistic entitlement leaves the region's reserve for guaranteed growth). Not a
    requirement of a task already placed (`keeps` False)."""

    reserve: int
    field: str = "reserve"
    resource: bool = False
    keeps: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return f"free beyond the reserve of {self.reserve} per dc"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return (overlay.owner(machine.id) is not None
                or overlay.pool_left(machine.machine_type, machine.dc) > self.reserve)


@dataclass(frozen=True, slots=True)
class FreeCpuFilter:
    cpus: float
    field: str = "cpus"
    resource: bool = True

    @property
    def name(self) -> str:
        return f"cpu>={self.cpus:g}"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return overlay.free(machine.id)[0] >= self.cpus - EPSILON


@dataclass(frozen=True, slots=True)
class FreeMemoryFilter:
    memory_mb: int
    field: str = "memory_mb"
    resource: bool = True

    @property
    def name(self) -> str:
        return f"memory>={self.memory_mb}MB"

    def passes(self, machine: Machine, overlay: Overlay) -> bool:
        return overlay.free(machine.id)[1] >= self.memory_mb


def count_survivors(filters: Iterable[Filter], machines: Iterable[Machine], overlay: Overlay,
                    total: int) -> tuple[tuple[str, int], ...]:
    """("all", total) followed by (filter name, machines left after it), filters in order."""
    survivors = list(machines)
    counts = [("all", total)]
    for f in filters:
        survivors = [m for m in survivors if f.passes(m, overlay)]
        counts.append((f.name, len(survivors)))
    return tuple(counts)
