"""The agent's local HTTP endpoint: /healthz, /status (JSON), /metrics (Prometheus text).

Bound to loopback or a unix socket: it is for the host's operator and monitoring, not the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from agent import metrics
from agent.health import HealthReport
from agent.listener import ConnLimits, Listener

_dumps = partial(json.dumps, default=str)


@dataclass(frozen=True)
class Endpoints:
    """What the endpoint serves: the agent's status, its last health probe, and its metrics."""

    status: Callable[[], dict]
    health: Callable[[], HealthReport | None]
    registry: CollectorRegistry = field(init=False)  # the metrics, made from the status at each scrape

    def __post_init__(self) -> None:
        object.__setattr__(self, "registry", metrics.registry(self.status))


ENDPOINTS = web.AppKey("endpoints", Endpoints)


async def _healthz(request: web.Request) -> web.Response:
    h = request.app[ENDPOINTS].health()
    ok = h is None or h.ok
    return web.Response(status=200 if ok else 503, text="ok\n" if ok else "unhealthy: " + "; ".join(h.problems) + "\n")


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENDPOINTS].status(), dumps=_dumps)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=metrics.text(request.app[ENDPOINTS].registry).encode(),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(endpoints: Endpoints) -> web.Application:
    app = web.Application()
    app[ENDPOINTS] = endpoints
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    return app


class Served:
    """The status server: cleanup() stops it."""

    def __init__(self, runner: web.AppRunner, listener: Listener | None):
        self.runner, self.listener = runner, listener

    async def cleanup(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        await self.runner.cleanup()


async def serve(listen: str, endpoints: Endpoints) -> Served:
    """On a unix socket (only local users reach it), or on TCP within the connection limits that
    guard the control daemon's API (agent/listener.py). `listen`: HOST:PORT or unix:PATH."""
    limits = ConnLimits(per_client=32, total=256)
    runner = web.AppRunner(make_app(endpoints), access_log=None, **limits.runner_kwargs())
    await runner.setup()
    if listen.startswith("unix:"):
        await web.UnixSite(runner, listen[len("unix:"):]).start()
        return Served(runner, None)
    host, _, port = listen.rpartition(":")
    return Served(runner, await Listener(runner, limits).start(host or "127.0.0.1", int(port)))
