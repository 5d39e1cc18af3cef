"""/v1/maintenance: planned maintenance, the ops planner's (opsplanner/)."""

from __future__ import annotations

import time

from aiohttp import web

from controlplane.frontend import schema as S
from controlplane.frontend.body import body, query_flag, reply
from controlplane.opsplanner.planner import OpsPlanner


class Maintenance:
    def __init__(self, ops: OpsPlanner):
        self.ops = ops

    async def schedule(self, request: web.Request) -> web.Response:
        now = time.time()
        e = await self.ops.schedule(await body(request, schema=S.MaintenanceSpec), now)
        return reply(self.ops.answer(e, now), 201)

    async def list(self, request: web.Request) -> web.Response:
        now = time.time()
        events = self.ops.listing(query_flag(request, "all"), now)  # all, or those not over
        return reply({"maintenance": [self.ops.answer(e, now) for e in events]})

    async def show(self, request: web.Request) -> web.Response:
        return reply(self.ops.answer(self.ops.get(request.match_info["id"]), time.time()))

    async def end(self, request: web.Request) -> web.Response:
        now = time.time()
        e = await self.ops.end(request.match_info["id"], now)
        return reply(self.ops.answer(e, now))
