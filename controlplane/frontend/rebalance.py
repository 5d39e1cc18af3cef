"""/v1/rebalance/plan (issue #27, its first step): what the ReBalancer would do, as a dry run. Any
replica answers from its view: the groups are taken from it at once, then solved in a thread (the
solver's time limit per group), so that the event loop goes on meanwhile."""

from __future__ import annotations

import asyncio

from aiohttp import web

from controlplane.frontend.body import reply
from controlplane.rebalancer.view import region
from controlplane.store.records import NAME, ApiError
from controlplane.store.state import RegionState
from controlplane.usage.region import RegionUsage

MAX_GROUPS = 200  # groups solved for one request (a region-wide plan of a large region: ask per entitlement)


class Rebalance:
    def __init__(self, state: RegionState, usage: RegionUsage | None = None):
        self.state, self.usage = state, usage
        self._solving = asyncio.Semaphore(1)  # one plan at a time: each uses a core while it solves

    async def plan(self, request: web.Request) -> web.Response:
        ent = request.query.get("entitlement")
        if ent is not None and not NAME.fullmatch(ent):
            raise ApiError("invalid", "entitlement", f"{ent[:80]!r} is not an entitlement name")
        if ent is not None and ent not in self.state.entitlements:
            raise ApiError("not_found", "entitlement", f"no entitlement {ent!r}")
        try:
            from controlplane.rebalancer.plan import plan  # OR-Tools: loaded at the first plan, not at start
        except ImportError as e:
            raise ApiError("unavailable", None, f"the ReBalancer needs OR-Tools ({e}): install twine with its "
                           "rebalancer extra (pip install 'twine[rebalancer]')") from None
        view = region(self.state, ent, self.usage.jobs() if self.usage is not None else None)
        if len(view.groups) > MAX_GROUPS:
            raise ApiError("unprocessable", "entitlement", f"{len(view.groups)} (entitlement, MSB) groups to solve; "
                           f"at most {MAX_GROUPS} in one plan: ask for one entitlement at a time")
        async with self._solving:
            result = await asyncio.to_thread(plan, view)
        return reply({"entitlement": ent, **result.to_json()})
