"""/v1/entitlements: quota-backed pseudo clusters (paper 2.2). An admin creates them with a
machine type, a quota and a host profile; each lives in one scheduler shard."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from agent.errors import InputError
from controlplane.frontend import schema as S
from controlplane.frontend.body import body, reply
from controlplane.frontend.answering import entitlement_answer
from controlplane.rollouts.driver import events, next_record, wanted_doc
from controlplane.rollouts.record import FINAL, baseline
from controlplane.store import Versioned
from controlplane.store.records import ApiError, EntitlementRec
from controlplane.store.shards import least_loaded_shard
from controlplane.store.state import RegionState


def entitlement_of(state: RegionState, name: str) -> EntitlementRec:
    e = state.entitlements.get(name)
    if e is None:
        raise ApiError("not_found", "entitlement", f"no entitlement {name!r}")
    return e


class Entitlements:
    def __init__(self, state: RegionState, profile_search: tuple[Path, ...] | None):
        self.state = state
        self.profile_search = profile_search  # where a profile named by an entitlement must load from

    def _check_profile(self, e: EntitlementRec) -> None:
        if e.profile is None:
            return
        from agent.profiles.loader import ProfileName, load

        try:
            load(ProfileName(e.profile), self.profile_search)
        except InputError as err:
            raise ApiError("unprocessable", "profile", f"{e.profile!r}: {err.why}") from None

    async def create(self, request: web.Request) -> web.Response:
        st = self.state
        e = EntitlementRec.parse(await body(request, schema=S.EntitlementSpec))
        e = replace(e, shard=least_loaded_shard(st))
        if e.name in st.entitlements:
            raise ApiError("exists", "name", f"entitlement {e.name!r} exists")
        self._check_profile(e)
        key, rkey, now = st.keys.entitlement(e.name), st.keys.rollout(e.name), time.time()
        # its profile pinned from the start (controlplane/rollouts): an edit of the file rolls out
        await st.write([st.guard(key), st.guard(rkey)],
                       {key: e.to_json(), rkey: baseline(e.name, wanted_doc(st, e.profile), now)})
        return reply(entitlement_answer(st, e.name, detail=True), 201)

    async def modify(self, request: web.Request) -> web.Response:
        st = self.state
        old = entitlement_of(st, request.match_info["name"])
        key = st.keys.entitlement(old.name)
        read_revision = st.revs[key]
        new = old.modified(await body(request, schema=S.EntitlementPatch))
        held = len(st.machines_of(old.name))
        if new.quota < held:
            raise ApiError("quota", "quota", f"{new.quota} is below the {held} machines {old.name} holds now; "
                           "shrink its jobs first")
        self._check_profile(new)
        puts, rkey, now = {key: new.to_json()}, st.keys.rollout(old.name), time.time()
        # a new profile begins its rollout in this write (the shard's leader moves it on); one
        # changed during a rollout begins when that one ends
        final = old.name in st.rollouts and st.rollouts[old.name]["state"] in FINAL
        record, notes = next_record(st, old.name, now, new) if final else (None, [])
        if record is not None and record is not st.rollouts.get(old.name):
            puts.update({rkey: record, **events(st, old.name, notes, now)})
        await st.write([Versioned(key, None, read_revision), st.guard(rkey)], puts)
        return reply(entitlement_answer(st, new.name, detail=True))

    async def move(self, request: web.Request) -> web.Response:
        """Give the entitlement to another scheduler shard. Nothing of its jobs is restarted: the new
        shard's leader takes over their records; the old one's commits, fenced by the entitlement's
        record, fail from this write on."""
        st = self.state
        old = entitlement_of(st, request.match_info["name"])
        shard = (await body(request, schema=S.EntitlementMove))["shard"]  # an integer >= 0 (the schema)
        if shard >= st.shard_count:
            raise ApiError("unprocessable", "shard", f"{shard!r}: the region's shards are 0-{st.shard_count - 1}")
        if shard != old.shard:
            key = st.keys.entitlement(old.name)
            await st.write([st.guard(key)], {key: replace(old, shard=shard).to_json()})
        return reply(entitlement_answer(st, old.name, detail=True))

    async def list(self, request: web.Request) -> web.Response:
        return reply({"entitlements": [entitlement_answer(self.state, n) for n in sorted(self.state.entitlements)]})

    async def show(self, request: web.Request) -> web.Response:
        return reply(entitlement_answer(self.state, entitlement_of(self.state, request.match_info["name"]).name,
                                      detail=True))
