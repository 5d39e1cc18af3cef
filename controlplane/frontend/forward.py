"""Any replica answers any request: one that must be acted on by a shard's leader (a job's create,
its status with the leader's plan) is forwarded to the process that leads the shard."""

from __future__ import annotations

from typing import Callable

import aiohttp
from aiohttp import web

from controlplane.coordination.coordinator import Coordinator
from controlplane.store.records import ApiError

FORWARDED = "X-Twine-Forwarded"  # the member that forwarded the request: it is not forwarded again
FORWARDED_TO = "forwarded_to"  # request key: where this replica forwarded the request
HOP_HEADERS = ("Authorization", "Content-Type", "Accept")


class Forwarder:
    def __init__(self, coordinator: Coordinator | None, http: Callable[[], aiohttp.ClientSession]):
        self.coordinator = coordinator  # None: a lone daemon with no replicas to forward to
        self.http = http  # the session for requests to other replicas (verified by --tls-ca)

    async def forward(self, request: web.Request, shard: int | None) -> web.StreamResponse:
        """Answer with the response of the process that leads `shard`."""
        coord = self.coordinator
        url = coord.leader_url(shard) if coord is not None and shard is not None else None
        if url is None or url == coord.url or FORWARDED in request.headers:
            raise ApiError("unavailable", None, f"shard {shard} has no leader that can take this now (an election "
                           "is under way, or the leader just changed); retry in a second")
        headers = {h: request.headers[h] for h in HOP_HEADERS if h in request.headers}
        headers[FORWARDED] = coord.id
        request[FORWARDED_TO] = url  # the replica that acts on it writes the audit line
        data = await request.read()
        try:
            async with self.http().request(request.method, url + request.path_qs, data=data or None, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=60)) as r:
                payload = await r.read()
                return web.Response(status=r.status, body=payload, content_type=r.content_type)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ApiError("unavailable", None, f"shard {shard}'s leader at {url} did not answer: "
                           f"{type(e).__name__}: {e}") from None
