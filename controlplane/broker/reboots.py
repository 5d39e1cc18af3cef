"""Clean reboots announced by a machine's agent: planned unavailability, not a failure.

An agent stopped by systemd while the host shuts down for a reboot says so
(`POST /v1/agent/shutdown {"reason": "reboot"}`). The ops planner's machinery then treats the
machine as in maintenance from now for `grace` seconds (policy stop): it takes no new tasks, its
tasks are suspended where they are (discovery off; TaskControllers get the advance notice and may
move theirs), its silence is no failure event. Its first heartbeat after that ends the maintenance
and its tasks start again on the same machine, once its agent has applied its profile again. A
machine not back within `grace` is handled as after any maintenance: its tasks are lost after
the maintenance grace, and placed elsewhere.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from controlplane.store.records import EventRec
from controlplane.store.state import RegionState
from controlplane.store import Store
from controlplane.store.keys import Keys

log = logging.getLogger("twine.controld.reboots")
REASON = "reboot announced by its agent"
# A heartbeat this soon after the notice may have been on its way before the agent stopped.
SETTLE = 1.0


class Reboots:
    def __init__(self, state: RegionState, store: Store, keys: Keys, grace: float = 300.0):
        self.state = state
        self.store = store
        self.keys = keys
        self.grace = grace
        self.counters = {"announced": 0, "returned": 0}

    def _open(self, mid: str, now: float) -> EventRec | None:
        e = self.state.maintenance.of(mid, now)  # indexed by machine: a dict lookup per heartbeat
        return e if e is not None and e.reason == REASON else None

    async def announce(self, mid: str, body: dict) -> dict:
        """A clean reboot announced (the body's reason is "reboot": schema.Shutdown)."""
        now = time.time()
        e = self._open(mid, now)
        if e is None:
            eid = f"reboot-{mid}-{int(now * 1000)}"
            e = EventRec(eid, "maintenance", (mid,), now, REASON, self.grace, now, None, mid, "stop", now)
            key = self.keys.event(eid)
            rev = await self.store.commit([self.state.guard(key)], {key: e.to_json()})
            await self.state.wait_for(rev)
            self.state.changed.set()
            self.counters["announced"] += 1
            log.warning("machine %s is rebooting; its tasks wait for it for %.0f s", mid, self.grace)
        return {"ok": True, "maintenance": e.id, "until": e.until}

    async def seen(self, mid: str) -> None:
        """A heartbeat: a machine back from its announced reboot ends its maintenance."""
        now = time.time()
        e = self._open(mid, now)
        if e is None or now - e.created < SETTLE:
            return
        key = self.keys.event(e.id)

        def compute(reads):
            cur = reads[key].value
            if cur is None or EventRec.from_json(cur).end is not None:
                return {}, []
            return {key: replace(EventRec.from_json(cur), end=now).to_json()}, []

        rev = await self.store.update([key], compute)
        if rev:
            await self.state.wait_for(rev)
            self.state.changed.set()
            self.counters["returned"] += 1
            log.warning("machine %s is back from its reboot after %.0f s", mid, now - e.start)
