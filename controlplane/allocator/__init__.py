"""The allocator: pure placement of a job's tasks on machines, reading a snapshot it never changes.

The scheduler calls `allocate(snapshot, request)` and commits the returned Placement in one etcd
transaction guarded by its claims (optimistic concurrency; on conflict: re-read, rebuild the
snapshot, allocate again).

There is no cache of allocations (issue #24): the scheduler asks the allocator only when a job's
tasks need machines (a create, a resize up, a replacement, a move), each a question it has not
asked before; a cache of answers hit 2 times in 250 in a realistic mix (bench_allocation_mix.py)."""

from .allocate import allocate
from .errors import AllocationError, InvalidRequest, NoPlacement, QuotaExceeded, ReserveKept
from .model import (Entitlement, JobRequest, Machine, MachineClaim, PlacedTask, Placement,
                    SoftPreference, SpreadPolicy)
from .naive import allocate_naive
from .snapshot import Snapshot

__all__ = [
    "AllocationError", "Entitlement", "InvalidRequest", "JobRequest",
    "Machine", "MachineClaim", "NoPlacement", "PlacedTask", "Placement", "QuotaExceeded", "ReserveKept", "Snapshot",
    "SoftPreference", "SpreadPolicy", "allocate", "allocate_naive",
]
