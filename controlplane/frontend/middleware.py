"""Around every handler: authentication and authorization, the roles this process serves, errors
made into answers (a 4xx naming the field; 503 naming why etcd cannot be reached), the audit log,
and the marks of an answer from a view that may be behind etcd.

While etcd is unreachable the API keeps answering: reads from the daemon's cache, marked
`X-Twine-Stale: <why>`; a request that needs etcd, and /healthz, answer 503 `unavailable` naming
the cause (docs/api.md, "When etcd is unreachable").
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from aiohttp import web

from controlplane.allocator.errors import AllocatorInconsistency
from controlplane.frontend.auth import MACHINE, PRINCIPAL, Authenticator
from controlplane.frontend.body import reply
from controlplane.frontend.forward import FORWARDED, FORWARDED_TO
from controlplane.security import tokens
from controlplane.store import Conflict, TooLarge, Unavailable
from controlplane.store.etcd import UNREACHABLE
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState

log = logging.getLogger("twine.controld.api")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC = ("/v1/openapi.json", "/healthz")
PAGE = "/ui"  # the fleet page's static files (frontend/ui.py): no data, no token; it calls the API with one
SERVED_BY_EVERY_ROLE = (*PUBLIC, "/v1/metrics", "/v1/cluster", "/v1/internal/relay")
# a member with the health role takes the heartbeats of the machines it judges: their agents send
# them there (the answer's heartbeat_to), so a health check in a process of its own hears them
# whatever the frontend and the schedulers are doing
SERVED_BY_HEALTH = ("/v1/agent/heartbeat",)
STALE = "X-Twine-Stale"  # on an answer from the cache while etcd is unreachable: why it may be behind
NOT_AUDITED = ("/v1/agent/heartbeat", "/v1/internal/relay")  # changes of state every second, not of intent


class Gate:
    def __init__(self, state: RegionState, auth: Authenticator, roles: tuple[str, ...]):
        self.state = state
        self.auth = auth
        self.roles = roles

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._answer(request, handler)
        # a forwarded change is written to the audit log by the replica that acts on it, not twice
        if request.method not in ("GET", "HEAD", "OPTIONS") and request.path not in NOT_AUDITED \
                and not request.get(FORWARDED_TO):
            who = request.get(PRINCIPAL)
            tokens.audit.info("%s %s %s -> %d", who.name if who else (f"machine {request[MACHINE]}" if request.get(MACHINE)
                              else "unauthenticated"), request.method, request.path_qs, response.status)
        return response

    async def _caught_up(self) -> bool:
        """Whether this view was behind etcd's current revision, and has now seen it (a 404, or an
        agent's credential not known, is then asked again: every replica answers as etcd holds the
        region, not as its watch has it so far). False when it was not behind, or etcd cannot say:
        the 404 (401) stands."""
        st = self.state
        seen = st.revision  # what the 404 was answered from
        try:
            _, revision = await st.store.range(st.keys.settings())
            if revision <= seen:
                return False
            await st.wait_for(revision, timeout=5)
            return True
        except Exception:  # noqa: BLE001 - etcd away or the watch slow: the answer is the view's
            return False

    def _admit(self, request: web.Request) -> None:
        """Authenticate the request, and refuse what this process's roles do not serve."""
        roles = self.roles
        if request.path not in PUBLIC and not (request.path == PAGE or request.path.startswith(PAGE + "/")):
            self.auth.authenticate(request)
        if "frontend" not in roles and request.path not in SERVED_BY_EVERY_ROLE and FORWARDED not in request.headers \
                and not ("health" in roles and request.path in SERVED_BY_HEALTH):
            raise ApiError("unavailable", None, f"this process serves no API (roles: {','.join(roles)}); "
                           "ask a replica with the frontend role (GET /v1/cluster lists them)")

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        st = self.state
        try:
            try:
                self._admit(request)
            except ApiError as e:
                # a machine's credential this view has not read yet: registered through another
                # replica a moment ago, which named this one for its heartbeats (heartbeat_to)
                if e.kind != "unauthorized" or not request.path.startswith("/v1/agent/") or st.stale \
                        or not await self._caught_up():
                    raise
                self._admit(request)
            try:
                response = await handler(request)
            except ApiError as e:
                # (not while etcd is unreachable: the view is all there is, and the answer says so)
                if e.kind != "not_found" or st.stale or not await self._caught_up():
                    raise
                # this view was behind etcd: what the request names may have just been written through
                # another replica (created there, then asked for here): asked again, now caught up
                response = await handler(request)
            if stale := st.stale:
                response.headers[STALE] = _header(stale)
            return response
        except Exception as e:
            answer = self._error(request, e)
            if answer is None:
                raise
            return answer

    def _error(self, request: web.Request, e: Exception) -> web.Response | None:
        """The answer to a request that raised `e`: a 4xx naming the field, 409 for a lost race, 503
        naming why etcd cannot take it, 500 naming the job for an allocator's inconsistency; None for
        any other bug (the server's 500)."""
        st = self.state
        if isinstance(e, ApiError):
            response = reply(e.to_json(), e.status)
            if e.kind == "timeout":
                response.force_close()  # the rest of the body is not waited for
            return response
        if isinstance(e, Conflict):
            return reply(ApiError("conflict", None, "a concurrent change won; retry").to_json(), 409)
        if isinstance(e, TooLarge):
            return reply(ApiError("unavailable", None, str(e)).to_json(), 503)
        if isinstance(e, (Unavailable, *UNREACHABLE)):
            why = str(e) if isinstance(e, Unavailable) else f"etcd unreachable at {st.store.endpoint}: {e}"
            return reply(ApiError("unavailable", None, why).to_json(), 503)
        if isinstance(e, TimeoutError):
            if not (stale := st.stale):
                return None
            # written, but the cache cannot show it yet: waiting for the watch (read-your-writes) timed out
            return reply(ApiError("unavailable", None, f"{stale} (this request's change may have been "
                                  "written: read it again once etcd answers)").to_json(), 503)
        if isinstance(e, AllocatorInconsistency):
            return _allocator_bug(request, e)
        if isinstance(e, web.HTTPNotFound):
            return reply(ApiError("not_found", "path", f"no such endpoint {request.path}").to_json(), 404)
        if isinstance(e, web.HTTPMethodNotAllowed):
            response = reply({"error": "invalid", "field": "method", "why": f"{request.method} is not allowed; "
                              f"allowed: {', '.join(sorted(e.allowed_methods))}"}, 405)
            response.headers["Allow"] = ", ".join(sorted(e.allowed_methods))
            return response
        return None


def _allocator_bug(request: web.Request, e: AllocatorInconsistency) -> web.Response:
    """A bug, not the request's fault: a 500 that names the job and what disagreed, logged here once
    with its traceback (the answer stands in for aiohttp's bare 500 and its log of it)."""
    log.error("%s %s: %s", request.method, request.path, e, exc_info=e)
    return reply({"error": "internal", "field": None, "job": e.job,
                  "why": f"{e} (a bug in twine-controld, not in the request; nothing was written)"}, 500)


def _header(text: str) -> str:
    return " ".join(text.split()).encode("latin-1", "replace").decode("latin-1")[:1000]
