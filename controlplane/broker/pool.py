"""The free pool (paper Figure 7): a machine holding nothing more, no task and no tombstone, leaves
its entitlement for the regional free pool, from which any entitlement takes it again when one of
its jobs is placed there (the scheduler's transaction, which writes the machine's record).

Both ways are written in the transaction that changes what the machine holds, guarded by its
record and by the entitlement's, so that two shards never take one machine and a quota is never
overrun: the scheduler's placements and removals (scheduler/txn.py) and the health check's
tombstone drops (health/tombstones.py).
"""

from __future__ import annotations


def back_to_pool(m: dict, tasks: int) -> str | None:
    """A machine record (JSON) that holds nothing more, no task (`tasks`: how many it holds, as the
    region's view counts them: RegionState.tasks_held) and no tombstone, leaves its entitlement for
    the free pool (paper Figure 7), in place; returns the entitlement it left (None: it stays). The
    scheduler's transactions and the health check's tombstone drops both end so; each writes that
    entitlement's record too."""
    if tasks > 0 or m.get("tombstones") or m.get("entitlement") is None:
        return None
    left = m["entitlement"]
    m["entitlement"] = None
    return left
