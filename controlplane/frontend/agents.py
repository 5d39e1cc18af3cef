"""/v1/agent/*: what machines' agents call (the resource broker's side: broker/agents.py).
Authenticated by a bootstrap token (register) or the machine's own credential (the rest)."""

from __future__ import annotations

from aiohttp import web

from agent.models import usage_beyond
from controlplane.broker.agents import CREDENTIAL_HEADER, AgentService
from controlplane.frontend import schema as S
from controlplane.frontend.auth import MACHINE
from controlplane.frontend.body import body, reply
from controlplane.store.records import ApiError


class Agents:
    def __init__(self, agents: AgentService):
        self.agents = agents

    async def register(self, request: web.Request) -> web.Response:
        return reply(await self.agents.register(await body(request, schema=S.AgentRegister),
                                                request.headers.get(CREDENTIAL_HEADER)))

    async def desired(self, request: web.Request) -> web.Response:
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= S.MAX_WAIT_ASKED:  # NaN too; more than the longest wait (--max-long-poll) is that wait
            raise ApiError("invalid", "wait", f"must be a number of seconds from 0 to {S.MAX_WAIT_ASKED}")
        version = request.query.get("version", "")
        if len(version) > S.MAX_VERSION:
            raise ApiError("invalid", "version", f"a desired state's version has at most {S.MAX_VERSION} characters")
        return reply(await self.agents.desired(request[MACHINE], version, wait))

    async def heartbeat(self, request: web.Request) -> web.Response:
        data = await body(request, schema=S.Heartbeat)
        if (usage := data.get("usage")) is not None and (bad := usage_beyond(usage)) is not None:
            self.agents.counters["usage_refused"] += 1  # refused as the rest of a bad heartbeat
            raise ApiError("unprocessable", *bad)  # the schema allows it; the host it describes does not
        return reply(await self.agents.heartbeat(request[MACHINE], data))

    async def shutdown(self, request: web.Request) -> web.Response:
        return reply(await self.agents.reboots.announce(request[MACHINE], await body(request, schema=S.Shutdown)))
