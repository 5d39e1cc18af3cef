"""/v1/capacity: opportunistic capacity (controlplane/capacity). The reclaims open and the last
ones over, the switch that pauses them and the reserve (admin): `twinectl capacity
[status|pause|resume|reserve N]`;
the machines opportunistic work can count on for the next 24 hours (`forecast`) and how well the
region kept what it offered (`slo`), from the pool's history in etcd (capacity/slo.py), and that
history itself (`history`, the fleet page's capacity view)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from aiohttp import web

from controlplane.capacity import slo
from controlplane.capacity.recorder import CapacityRecorder
from controlplane.capacity.reclaim import paused
from controlplane.frontend import schema as S
from controlplane.frontend.body import body, query_entitlement, reply
from controlplane.frontend.usage import seconds
from controlplane.store.records import ApiError, EventRec
from controlplane.store.state import RegionState

RECENT = 20
HISTORY_SINCE = 7 * 86400  # the hours /v1/capacity/history gives by default: a week


def reclaim_answer(state: RegionState, e: EventRec, now: float) -> dict:
    left = sum(1 for mid in e.machines if (m := state.machines.get(mid)) is None or m.entitlement != e.scope)
    phase = "over" if e.end is not None else "notice" if now < e.due else "stopping"
    return {"id": e.id, "entitlement": e.scope, "heir": e.heir, "cause": e.cause, "machines": list(e.machines),
            "left": left, "start": e.start, "deadline": e.due, "end": e.end, "phase": phase, "reason": e.reason}


def reclaims_by_cause(events, since: float) -> dict[str, dict]:
    """The reclaims begun since `since`, per cause: how many, the notice they gave (deadline -
    start: 0 for a failure), and how many were over before their deadline (acked early)."""
    out: dict[str, dict] = {}
    for e in events:
        if e.kind != "reclaim" or e.start < since:
            continue
        c = out.setdefault(e.cause or "demand", {"reclaims": 0, "machines": 0, "notice_s": [], "over_early": 0})
        c["reclaims"] += 1
        c["machines"] += len(e.machines)
        c["notice_s"].append(e.due - e.start)
        c["over_early"] += e.end is not None and e.end < e.due
    for c in out.values():
        n = c.pop("notice_s")
        c["notice_s"] = {"least": round(min(n), 1), "mean": round(sum(n) / len(n), 1), "most": round(max(n), 1)}
    return out


class CapacityView:
    def __init__(self, state: RegionState, history: CapacityRecorder | None = None):
        self.state = state
        self.history = history  # the pool's history in etcd (None: a process with no store to read)

    def _status(self) -> dict:
        now = time.time()
        reclaims = sorted((e for e in self.state.events.values() if e.kind == "reclaim"), key=lambda e: (e.start, e.id))
        return {"paused": paused(self.state), "reserve": self.state.reserve,
                "open": [reclaim_answer(self.state, e, now) for e in reclaims if e.end is None],
                "recent": [reclaim_answer(self.state, e, now) for e in reversed(reclaims) if e.end is not None][:RECENT]}

    async def status(self, request: web.Request) -> web.Response:
        return reply(self._status())

    async def pause(self, request: web.Request) -> web.Response:
        return await self._switch(True)

    async def resume(self, request: web.Request) -> web.Response:
        return await self._switch(False)

    async def reserve(self, request: web.Request) -> web.Response:
        """POST /v1/capacity/reserve {"machines": N}."""
        return await self._settings(reserve=(await body(request, schema=S.CapacityReserve))["machines"])

    async def _switch(self, paused: bool) -> web.Response:
        return await self._settings(paused=paused)

    async def _settings(self, **changes) -> web.Response:
        """The settings changed as asked, the others kept (a write since this view read them: 409)."""
        key = self.state.keys.capacity_settings()
        await self.state.write([self.state.guard(key)], {key: {**self.state.capacity_settings.get("", {}), **changes}})
        return reply(self._status())

    def _wanted(self, request: web.Request) -> Callable[[str], bool]:
        """The groups an entitlement's machines can come from (?entitlement=: its machine type, in
        its pinned dc if it has one), or every group."""
        name = query_entitlement(request, self.state.entitlements)
        if name is None:
            return lambda group: True
        ent = self.state.entitlements[name]
        return lambda group: (slo.of_group(group)[0] == ent.machine_type
                              and ent.spread.pinned_dc in (None, slo.of_group(group)[1]))

    async def _history(self) -> slo.History:
        if self.history is None:
            raise ApiError("unavailable", None, "this process keeps no capacity history (no scheduler role)")
        return await self.history.history()

    async def forecast(self, request: web.Request) -> web.Response:
        wanted = self._wanted(request)
        now = time.time()
        h, pool = await self._history(), slo.pool(self.state, now)
        groups = {g for g in set(pool) | h.groups() if wanted(g)}
        fc = await asyncio.to_thread(slo.forecast, h, pool, int(now // 3600), groups)
        return reply({"levels": list(slo.LEVELS), "offered_level": slo.LEVELS[0], "history_hours": len(h.hours),
                      "groups": [{"group": g, "now": pool.get(g, {}), "hours": rows} for g, rows in fc.items()]})

    async def past(self, request: web.Request) -> web.Response:
        """The pool's hours kept, per group: its figures (available: the hour's least; the others
        its most) and the line offered for it earliest (None: no offer was made for it)."""
        wanted = self._wanted(request)
        since = seconds(request, "since", HISTORY_SINCE, 3600, slo.HOURS_KEPT * 3600)
        now = time.time()
        h = await self._history()
        first = int((now - since) // 3600)
        groups = sorted(g for g in h.groups() if wanted(g))
        offered = await asyncio.to_thread(lambda: {g: {t: o for t, o, _, _ in slo.judged(h, g)} for g in groups})
        return reply({"since": first * 3600, "step": 3600, "groups": [
            {"group": g, "hours": [{"hour": t * 3600, **{k: rec[g].get(k, 0) for k in slo.FIGURES},
                                    "offered": offered[g].get(t)}
                                   for t, rec in sorted(h.hours.items()) if t >= first and g in rec]}
            for g in groups]})

    async def service_level(self, request: web.Request) -> web.Response:
        wanted = self._wanted(request)
        now = time.time()
        h = await self._history()
        since = min(h.hours, default=int(now // 3600)) * 3600
        got = slo.delivered(h, {g for g in h.groups() if wanted(g)})
        return reply({"objective": slo.LEVELS[0], "since": since,
                      "groups": [{"group": g, **v} for g, v in got.items()],
                      "reclaims": reclaims_by_cause(self.state.events.values(), since)})
