"""/v1/machines (the region's machines, as the resource broker and the health check keep them) and
/v1/events (unavailability events: failures and maintenance)."""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from controlplane.broker.agents import AgentService
from controlplane.frontend.body import reply
from controlplane.frontend.answering import machine_answer
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState


class Machines:
    def __init__(self, state: RegionState, agents: AgentService, clean: Callable[[str], Awaitable[None]]):
        self.state = state
        self.agents = agents  # what the broker knows of each machine's agent; the admin's release
        self.clean_machine = clean  # the health check's: drops a machine's tombstones

    def _machine(self, request: web.Request) -> str:
        mid = request.match_info["id"]
        if mid not in self.state.machines:
            raise ApiError("not_found", "machine", f"no machine {mid!r}")
        return mid

    async def list(self, request: web.Request) -> web.Response:
        """Every machine, or those of one dc and/or msb (?dc=, ?msb=: the fleet page opens one MSB)."""
        where = {k: request.query[k] for k in ("dc", "msb") if k in request.query}
        for k, v in where.items():
            if not 0 < len(v) <= 253:
                raise ApiError("invalid", k, "a label of 1 to 253 characters")
        ms = self.state.machines
        mids = sorted(mid for mid, m in ms.items() if all(m.labels.get(k) == v for k, v in where.items())) \
            if where else sorted(ms)
        return reply({"machines": [machine_answer(self.state, self.agents, mid) for mid in mids]})

    async def show(self, request: web.Request) -> web.Response:
        return reply(machine_answer(self.state, self.agents, self._machine(request), detail=True))

    async def release(self, request: web.Request) -> web.Response:
        """An admin's action on one machine; the answer is the machine as it is after."""
        mid = self._machine(request)
        await self.agents.release(mid)
        return reply(machine_answer(self.state, self.agents, mid, detail=True))

    async def clean(self, request: web.Request) -> web.Response:
        mid = self._machine(request)
        await self.clean_machine(mid)
        return reply(machine_answer(self.state, self.agents, mid, detail=True))

    async def events(self, request: web.Request) -> web.Response:
        events = sorted(self.state.events.values(), key=lambda e: e.start)
        return reply({"events": [e.to_json() for e in events]})
