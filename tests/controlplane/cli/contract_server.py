"""ContractServer: a protocol stand-in for twine-controld, NOT the daemon.

It speaks docs/api.md's wire format (Bearer token, JSON bodies, `{"error","field","why"}` errors)
with canned answers, and records every request, so twinectl's HTTP path can be tested before the
real daemon exists. It runs its own event loop in a thread, so the test calls `twinectl.main()`
(which runs `asyncio.run`) in the test's own thread.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.controlplane.cli import samples


@dataclass
class Seen:
    method: str
    path: str
    query: dict
    body: Any
    authorization: str | None


Reply = tuple[int, Any]  # (status, JSON body) or (status, str: sent as text/html)


@dataclass
class ContractServer:
    token: str = "s3cret-token"
    routes: dict[tuple[str, str], Callable[[Seen], Reply]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """The default answers only, and no requests seen."""
        self.routes.clear()
        self.requests.clear()
        for (method, path), body in {
            ("GET", "/v1/entitlements"): samples.ENTITLEMENTS,
            ("GET", "/v1/entitlements/web"): samples.ENTITLEMENT_DETAIL,
            ("GET", "/v1/jobs"): samples.JOBS,
            ("GET", "/v1/jobs/web/frontend"): samples.JOB_RUNNING,
            ("GET", "/v1/machines"): samples.MACHINES,
            ("GET", "/v1/machines/m-001"): samples.MACHINE_DETAIL,
            ("GET", "/v1/events"): samples.EVENTS,
            ("GET", "/v1/discovery/web/frontend"): samples.DISCOVERY,
        }.items():
            self.reply(method, path, 200, body)
        self.on("POST", "/v1/jobs", lambda seen: (201, dict(samples.job(), **_spec_fields(seen.body))))
        self.on("POST", "/v1/entitlements", lambda seen: (201, dict(samples.ENTITLEMENT, held=0, **seen.body)))

    # --- canned answers ---
    def reply(self, method: str, path: str, status: int, body: Any) -> None:
        self.routes[(method, path)] = lambda seen: (status, samples.fresh(body) if isinstance(body, dict) else body)

    def on(self, method: str, path: str, fn: Callable[[Seen], Reply]) -> None:
        """`fn(seen)` answers; it may be a coroutine function (runs on the server's loop)."""
        self.routes[(method, path)] = fn

    def sequence(self, method: str, path: str, replies: list[Reply]) -> None:
        """Answer with each reply in turn, then keep answering with the last one."""
        left = list(replies)
        self.on(method, path, lambda seen: left.pop(0) if len(left) > 1 else left[0])

    def seen(self, method: str, path: str) -> list[Seen]:
        return [r for r in self.requests if r.method == method and r.path == path]

    # --- the wire ---
    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return _error(400, "invalid", None, "the body is not JSON")
        seen = Seen(request.method, request.path, dict(request.query), body, request.headers.get("Authorization"))
        self.requests.append(seen)
        if request.path != "/v1/openapi.json" and seen.authorization != f"Bearer {self.token}":
            return _error(401, "unauthorized", None, "missing or wrong API token")
        fn = self.routes.get((request.method, request.path))
        if fn is None:
            return _error(404, "not_found", None, f"no route {request.method} {request.path} in the stand-in")
        result = fn(seen)
        status, out = await result if inspect.isawaitable(result) else result
        if isinstance(out, str):
            return web.Response(status=status, text=out, content_type="text/html")
        return web.json_response(out, status=status)

    # --- lifecycle ---
    def start(self) -> ContractServer:
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def up() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, shutdown_timeout=0.5)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # port 0: the kernel's pick

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(up())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="contract-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the contract server did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _error(status: int, kind: str, field_: str | None, why: str) -> web.Response:
    return web.json_response(samples.error(kind, field_, why), status=status)


def _spec_fields(spec: Any) -> dict:
    spec = spec if isinstance(spec, dict) else {}
    out = {k: spec[k] for k in ("entitlement", "name", "count", "task") if k in spec}
    if "entitlement" in spec and "name" in spec:
        out["handle"] = f"{spec['entitlement']}/{spec['name']}"
    return out
