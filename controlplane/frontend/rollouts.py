"""/v1/entitlements/{name}/rollout: an entitlement's host-profile rollout (controlplane/rollouts),
and an admin's pause, resume and rollback of it. The shard leader drives the rollout; these write
the record guarded by its revision (a pass of the leader in between makes it a 409: try again)."""

from __future__ import annotations

import copy
import time

from aiohttp import web

from controlplane.frontend.body import reply
from controlplane.frontend.entitlements import entitlement_of
from controlplane.rollouts.advance import pause, resume, reverse
from controlplane.rollouts.record import label, machine_doc
from controlplane.store import Versioned
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState


def rollout_answer(st: RegionState, name: str) -> dict:
    r = st.rollouts.get(name)
    if r is None:
        raise ApiError("not_found", "rollout", f"entitlement {name!r} has no rollout record yet (its shard's leader "
                       "writes one within seconds of its creation)")
    machines = []
    ids = sorted(set(r["machines"]) | {m.id for m in st.machines_of(name)})
    for mid in ids:
        m, entry = st.machines.get(mid), r["machines"].get(mid, {})
        if m is None:
            continue
        holds = {"name": m.profile_applied, "hash": m.profile_hash} if m.profile_applied else None
        machines.append({"id": mid, "msb": str(m.labels.get("msb", "")), "phase": entry.get("phase", ""),
                         "batch": entry.get("batch", 0), "holds": label(holds) + ("" if m.profile_ok else " (not ok)"),
                         "wants": label(machine_doc(r, mid)), "why": entry.get("why", "")})
    return {"entitlement": name, "id": r["id"], "state": r["state"], "from": label(r["from"]), "to": label(r["to"]),
            "why": r["why"], "policy": r["policy"], "machines": machines, "batches": r["batches"],
            "created": r["created"], "updated": r["updated"]}


class Rollouts:
    def __init__(self, state: RegionState):
        self.state = state

    async def show(self, request: web.Request) -> web.Response:
        name = entitlement_of(self.state, request.match_info["name"]).name
        return reply(rollout_answer(self.state, name))

    async def _change(self, request: web.Request, verb: str) -> web.Response:
        st = self.state
        name = entitlement_of(st, request.match_info["name"]).name
        key = st.keys.rollout(name)
        current = st.rollouts.get(name)
        if current is None:
            rollout_answer(st, name)  # 404, saying why
        read = st.revs.get(key, 0)
        r, now = copy.deepcopy(current), time.time()
        try:
            if verb == "pause":
                pause(r, "paused by an admin", now)
            elif verb == "resume":
                resume(r, now)
            else:
                reverse(r, [m.id for m in st.machines_of(name)], "rolled back by an admin", now)
        except ValueError as e:
            raise ApiError("conflict", "state", str(e)) from None
        await st.write([Versioned(key, None, read)], {key: r})
        return reply(rollout_answer(st, name))

    async def pause(self, request: web.Request) -> web.Response:
        return await self._change(request, "pause")

    async def resume(self, request: web.Request) -> web.Response:
        return await self._change(request, "resume")

    async def rollback(self, request: web.Request) -> web.Response:
        return await self._change(request, "rollback")
