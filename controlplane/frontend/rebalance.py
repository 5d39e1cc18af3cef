"""/v1/rebalance (issue #27): what the ReBalancer would do (a dry run), one round that moves tasks,
the continuous mode, and what it is doing. Any replica answers: the view is taken from it at once,
then solved in a thread (the event loop goes on meanwhile); the moves are requests the jobs' shard
leaders carry out (controlplane/rebalancer/rounds.py, scheduler/moves.py)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from controlplane.frontend import schema as S
from controlplane.frontend.body import body, query_entitlement, reply
from controlplane.frontend.services import Shards
from controlplane.rebalancer.rounds import enabled, load_planner, plan_round, request_moves
from controlplane.scheduler.moves import move_id
from controlplane.scheduler.ops import Op
from controlplane.store import Conflict
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState
from controlplane.taskcontrol.session import op_json, unhealthy
from controlplane.usage.region import RegionUsage

MAX_GROUPS = 200  # groups solved for one request (a region-wide plan of a large region: ask per entitlement)


async def ask_controllers(st: RegionState, shards: Shards | None, moves: list[dict]) -> None:
    """Each planned move's `taskcontrol`: what its job's TaskController answers a dry-run call
    about it (asked by this replica where it leads the job's shard, in the job's own sequence;
    the acked ones are then reported cancelled, so a controller unaware of dry runs keeps none)."""
    by_job: dict[str, list[dict]] = {}
    for mv in moves:
        by_job.setdefault(mv["job"], []).append(mv)
    for handle, mine in by_job.items():
        job = st.jobs.get(handle)
        sched = shards.scheduler_for(handle) if shards is not None else None
        if job is None or not job.controller:
            why = "no TaskController: the job's update policy decides"
        elif sched is None or (session := sched.sessions.for_dry_run(job)) is None:
            why = "not asked: another replica leads the job's shard"
        else:
            ops = {move_id(mv["index"], mv["target"]): mv for mv in mine}
            request = [op_json(handle, Op("move", mv["index"], "rebalance", i, mv["source"], "rebalance"))
                       for i, mv in ops.items()]
            run_id = f"plan-{int(time.time() * 1000)}"
            try:
                acked = await session.dry_call(request, [], unhealthy(st.tasks.get(handle, {}), job.live_set()),
                                               run_id)
                await session.dry_call([], [{**op, "outcome": "cancelled"} for op in request if op["id"] in acked],
                                       [], run_id, end=True)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                why = f"asked, no answer: {type(e).__name__}: {e}"
            else:
                for i, mv in ops.items():
                    mv["taskcontrol"] = "would ack now" if i in acked else "would not ack now"
                continue
        for mv in mine:
            mv["taskcontrol"] = why


def max_moves_of(request: web.Request) -> int | None:
    """`?max_moves=N`: a round's move budget, a whole number from 0 to MAX_ROUND_MOVES (400 else)."""
    raw = request.query.get("max_moves")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) > S.MAX_ROUND_MOVES:
        raise ApiError("invalid", "max_moves", f"{raw[:20]!r}: a round's move budget is a whole number of moves "
                       f"from 0 to {S.MAX_ROUND_MOVES}")
    return int(raw)


class Rebalance:
    def __init__(self, state: RegionState, usage: RegionUsage | None = None, shards: Shards | None = None):
        self.state, self.usage, self.shards = state, usage, shards
        self._solving = asyncio.Semaphore(1)  # one plan at a time: each uses a core while it solves

    async def _plan(self, ent: str | None, max_moves: int | None = None):
        try:
            await load_planner()  # OR-Tools: loaded at the first plan, off the event loop
        except ImportError as e:
            raise ApiError("unavailable", None, f"the ReBalancer needs OR-Tools ({e}): install twine with its "
                           "rebalancer extra (pip install 'twine[rebalancer]')") from None
        groups = {(m.entitlement, m.labels.get("dc", ""), m.labels.get("msb", "")) for m in self.state.machines.values()
                  if m.entitlement is not None and (ent is None or m.entitlement == ent)}
        if len(groups) > MAX_GROUPS:
            raise ApiError("unprocessable", "entitlement", f"{len(groups)} (entitlement, MSB) groups to solve; "
                           f"at most {MAX_GROUPS} in one plan: ask for one entitlement at a time")
        async with self._solving:
            return await plan_round(self.state, self.usage, {ent} if ent else None, max_moves=max_moves)

    async def plan(self, request: web.Request) -> web.Response:
        ent = query_entitlement(request, self.state.entitlements)
        result = await self._plan(ent, max_moves_of(request))
        answer = {"entitlement": ent, **result.to_json()}
        await ask_controllers(self.state, self.shards, answer["moves"])
        return reply(answer)

    async def apply(self, request: web.Request) -> web.Response:
        """One round: the plan, and its moves requested of the jobs' shard leaders."""
        ent = query_entitlement(request, self.state.entitlements)
        result = await self._plan(ent, max_moves_of(request))
        now = time.time()
        round_id = f"round-{int(now * 1000)}"
        try:
            n = await request_moves(self.state, result, round_id, now)
        except Conflict:
            raise ApiError("conflict", None, "the jobs' rebalance records kept changing: try again") from None
        return reply({"entitlement": ent, "round": round_id, "requested": n, **result.to_json()})

    async def enable(self, request: web.Request) -> web.Response:
        return await self._switch(request, True)

    async def disable(self, request: web.Request) -> web.Response:
        return await self._switch(request, False)

    async def _switch(self, request: web.Request, on: bool) -> web.Response:
        """POST /v1/rebalance/{enable,disable} {"entitlement"?}: the continuous mode."""
        data = await body(request, schema=S.RebalanceSwitch)  # {} for every entitlement
        ent = data.get("entitlement")
        if ent is not None and ent not in self.state.entitlements:
            raise ApiError("not_found", "entitlement", f"no entitlement {ent!r}")
        every, ents = enabled(self.state)
        if ent is None:
            every, ents = on, set() if not on else ents
        elif on:
            ents.add(ent)
        else:
            ents.discard(ent)
            if every:  # off for one while on for all: on for each of the others
                every, ents = False, set(self.state.entitlements) - {ent}
        key = self.state.keys.rebalance_settings()
        await self.state.write([self.state.guard(key)], {key: {"all": every, "entitlements": sorted(ents)}})
        return reply(self._status())

    async def status(self, request: web.Request) -> web.Response:
        return reply(self._status())

    def _status(self) -> dict:
        every, ents = enabled(self.state)
        moving, requested, recent = [], 0, []
        # a move begins in the commit that writes its job's rebalance record: only those jobs' tasks can move
        for handle in self.state.rebalance:
            for t in self.state.tasks.get(handle, {}).values():
                if t.moving is not None:
                    moving.append({"job": handle, "index": t.index, "source": t.machine, "target": t.moving.machine,
                                   "goal": t.moving.goal, "why": t.moving.why, "since": t.moving.since})
        for handle, rec in sorted(self.state.rebalance.items()):
            requested += len((rec or {}).get("requests") or {})
            for k, v in sorted(((rec or {}).get("recent") or {}).items()):
                if isinstance(v, dict):
                    recent.append({"job": handle, "index": int(k) if str(k).isdigit() else -1, **v})
        recent.sort(key=lambda r: -float(r.get("at", 0)))
        return {"continuous": {"all": every, "entitlements": sorted(ents)}, "moving": moving,
                "requested": requested, "recent": recent[:50]}

