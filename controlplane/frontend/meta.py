"""The API about itself and about the control plane: the OpenAPI document, /healthz, /v1/metrics,
/v1/cluster (members, shard leaders), and the replicas' internal relay."""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from controlplane.broker.relay import Relay
from controlplane.coordination.coordinator import Coordinator
from controlplane.frontend import schema as S
from controlplane.frontend.body import MAX_INTERNAL_BODY, body, reply
from controlplane.frontend.openapi import document
from controlplane.frontend.services import Shards
from controlplane.store.records import ApiError
from controlplane.store.shards import shard_loads
from controlplane.store.state import RegionState


class Meta:
    def __init__(self, state: RegionState, shards: Shards, coordinator: Coordinator | None, relay: Relay | None,
                 metrics: Callable[[], Awaitable[bytes]]):
        self.state, self.shards = state, shards
        self.coordinator, self.relay = coordinator, relay
        self.metrics_text = metrics

    async def openapi(self, request: web.Request) -> web.Response:
        return reply(document(self.state.keys.region))

    async def healthz(self, request: web.Request) -> web.Response:
        """200 when etcd answers now and this view follows it; else 503 saying why. etcd is asked on
        each call (as kube-apiserver's /healthz does), so the answer never lags an outage."""
        if stale := self.state.stale or await self.state.store.check():
            return reply({"ok": False, **ApiError("unavailable", None, stale).to_json()}, 503)
        return reply({"ok": True})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=await self.metrics_text(), content_type="text/plain", charset="utf-8")

    async def cluster(self, request: web.Request) -> web.Response:
        """Members, shard leaders (with the entitlements each shard holds) and this process."""
        st = self.state
        by_shard: dict[int, list[str]] = {}
        for e in st.entitlements.values():
            by_shard.setdefault(e.shard, []).append(e.name)
        loads = shard_loads(st)
        shards = []
        for n in range(st.shard_count):
            leader = st.leaders.get(n)
            local = self.shards.local(n)
            shards.append({"shard": n, "leader": leader.value.get("member") if leader else None,
                           "leader_url": leader.value.get("url") if leader else None,
                           "epoch": leader.mod_revision if leader else None,
                           "entitlements": sorted(by_shard.get(n, [])), "tasks": loads.get(n, 0),
                           **({"elected_at": local.elected_at, "first_commit_at": local.first_commit_at}
                              if local else {})})
        return reply({"region": st.keys.region, "self": self.coordinator.answer() if self.coordinator else None,
                      "members": sorted(st.members.values(), key=lambda m: m["id"]), "shards": shards})

    async def relay_in(self, request: web.Request) -> web.Response:
        if self.relay is None:
            raise ApiError("unavailable", None, "this process is starting")
        return reply(self.relay.receive(await body(request, MAX_INTERNAL_BODY, S.Relay, typed=True)))
