"""The entitlement-to-shard map's load: where a new entitlement goes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.store.state import RegionState


def shard_loads(st: "RegionState") -> dict[int, int]:
    """Tasks per shard, every shard listed."""
    loads = {s: 0 for s in range(st.shard_count)}
    for handle, ts in st.tasks.items():
        ent = st.entitlements.get(handle.partition("/")[0])
        if ent is not None:
            loads[ent.shard] = loads.get(ent.shard, 0) + len(ts)
    for e in st.entitlements.values():
        loads.setdefault(e.shard, 0)
    return loads


def least_loaded_shard(st: "RegionState") -> int:
    """Where a new entitlement goes: the shard with the fewest tasks, then entitlements."""
    loads = shard_loads(st)
    ents: dict[int, int] = {}
    for e in st.entitlements.values():
        ents[e.shard] = ents.get(e.shard, 0) + 1
    return min(range(st.shard_count), key=lambda s: (loads.get(s, 0), ents.get(s, 0), s))
