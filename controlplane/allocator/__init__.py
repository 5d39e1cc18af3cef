"""The allocator: pure placement of a job's tasks on machines, reading a snapshot it never changes.

The scheduler calls `allocate(snapshot, request, cache=cache)` and commits the returned Placement
in one etcd transaction guarded by its claims (optimistic concurrency; on conflict: re-read,
rebuild the snapshot, allocate again)."""

from .allocate import allocate
from .cache import AllocationCache, CacheStats
from .errors import AllocationError, InvalidRequest, NoPlacement, QuotaExceeded
from .model import (Entitlement, JobRequest, Machine, MachineClaim, PlacedTask, Placement,
                    SoftPreference, SpreadPolicy)
from .naive import allocate_naive
from .snapshot import Snapshot

__all__ = [
    "AllocationCache", "AllocationError", "CacheStats", "Entitlement", "InvalidRequest", "JobRequest",
    "Machine", "MachineClaim", "NoPlacement", "PlacedTask", "Placement", "QuotaExceeded", "Snapshot",
    "SoftPreference", "SpreadPolicy", "allocate", "allocate_naive",
]
