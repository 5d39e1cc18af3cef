"""/v1/capacity: opportunistic capacity (controlplane/capacity). The reclaims open and the last
ones over, and the switch that pauses them (admin): `twinectl capacity [status|pause|resume]`."""

from __future__ import annotations

import time

from aiohttp import web

from controlplane.capacity.reclaim import paused
from controlplane.frontend.body import reply
from controlplane.store.records import EventRec
from controlplane.store.state import RegionState

RECENT = 20


def reclaim_answer(state: RegionState, e: EventRec, now: float) -> dict:
    left = sum(1 for mid in e.machines if (m := state.machines.get(mid)) is None or m.entitlement != e.scope)
    phase = "over" if e.end is not None else "notice" if now < e.due else "stopping"
    return {"id": e.id, "entitlement": e.scope, "heir": e.heir, "cause": e.cause, "machines": list(e.machines),
            "left": left, "start": e.start, "deadline": e.due, "end": e.end, "phase": phase, "reason": e.reason}


class CapacityView:
    def __init__(self, state: RegionState):
        self.state = state

    def _status(self) -> dict:
        now = time.time()
        reclaims = sorted((e for e in self.state.events.values() if e.kind == "reclaim"), key=lambda e: (e.start, e.id))
        return {"paused": paused(self.state),
                "open": [reclaim_answer(self.state, e, now) for e in reclaims if e.end is None],
                "recent": [reclaim_answer(self.state, e, now) for e in reversed(reclaims) if e.end is not None][:RECENT]}

    async def status(self, request: web.Request) -> web.Response:
        return reply(self._status())

    async def pause(self, request: web.Request) -> web.Response:
        return await self._switch(True)

    async def resume(self, request: web.Request) -> web.Response:
        return await self._switch(False)

    async def _switch(self, paused: bool) -> web.Response:
        key = self.state.keys.capacity_settings()
        await self.state.write([self.state.guard(key)], {key: {"paused": paused}})
        return reply(self._status())
