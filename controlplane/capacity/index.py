"""The open reclaims by machine (RegionState.reclaims), kept as reclaim events change: which
reclaim covers a machine, and which machines take no new task for it (cordoned); and what the
scheduler's transactions ask of them (heir_of). The `state` these functions take is the
RegionState, which imports this module (so it is not imported here)."""

from __future__ import annotations

from typing import Mapping

from controlplane.store.records import EventRec, MachineRec


class Reclaims(dict):
    """machine id -> the open reclaim (an EventRec of kind reclaim) that covers it; and `began`:
    opportunistic entitlement -> when its last reclaim for demand began (its budget's cool-down)."""

    def __init__(self) -> None:
        super().__init__()
        self.began: dict[str, float] = {}

    def take(self, old: EventRec | None, new: EventRec | None) -> bool:
        """A reclaim event written (`new`) or gone (`old` before it); False for any other kind."""
        if not any(e is not None and e.kind == "reclaim" for e in (old, new)):
            return False
        if new is not None and new.kind == "reclaim" and new.scope and new.cause != "failure":
            self.began[new.scope] = max(self.began.get(new.scope, new.start), new.start)
        for e, is_new in ((old, False), (new, True)):
            for mid in (e.machines if e is not None else ()):
                if is_new and e.end is None:
                    self[mid] = e
                elif self.get(mid) is not None and self[mid].id == e.id:
                    del self[mid]
        return True

    def cordoned(self, machines: Mapping[str, MachineRec]) -> set[str]:
        """Its machines the opportunistic entitlement still holds: they take no new task."""
        return {mid for mid, e in self.items() if (m := machines.get(mid)) is not None and m.entitlement == e.scope}


def heir_of(state, mid: str, left: str, taking: Mapping[str, int]) -> str | None:
    """Who gets a machine that its last task just left (txn.finish): the heir of the open reclaim
    that covers it, if the machine was that reclaim's opportunistic entitlement's and the heir is
    under quota (`taking`: machines the same transaction gives it already); else None (the pool)."""
    e = state.reclaims.get(mid)
    if e is None or e.scope != left or e.heir is None:
        return None
    heir = state.entitlements.get(e.heir)
    if heir is None or len(state.machines_of(heir.name)) + taking.get(heir.name, 0) >= heir.quota:
        return None
    return heir.name


def in_flight(state, *, heir: str | None = None, scope: str | None = None) -> int:
    """Machines of open reclaims still held by their opportunistic entitlement (for `heir`, or
    taken from `scope`)."""
    return sum(1 for mid, e in state.reclaims.items()
               if (heir is None or e.heir == heir) and (scope is None or e.scope == scope)
               and (m := state.machines.get(mid)) is not None and m.entitlement == e.scope)
