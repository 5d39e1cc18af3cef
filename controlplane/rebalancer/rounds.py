"""Rounds of the ReBalancer that move tasks (issue #27): a round plans (plan.py) on the region's
view and writes each planned move as a request in its job's rebalance record
(scheduler/moverecords.py); the job's shard leader carries it out, make-before-break, through the
job's TaskController and the rate limits (scheduler/moves.py). The planner never moves a task.

`POST /v1/rebalance/apply` runs one round (`twinectl rebalance apply`); the continuous mode runs
one every `--rebalance-interval` seconds at the leader of shard 0, for the entitlements an admin
enabled (`twinectl rebalance enable|disable [--entitlement E]`; off until then). Tasks moved, or
tried, within the cool-down, and tasks with a request not yet begun, are left alone."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from types import ModuleType
from typing import TYPE_CHECKING

from controlplane.rebalancer.view import Region, region
from controlplane.scheduler.moverecords import cooling, moves_of
from controlplane.store import Conflict
from controlplane.store.state import RegionState
from controlplane.usage.book import in_slices

if TYPE_CHECKING:
    from controlplane.rebalancer.plan import Plan
    from controlplane.usage.region import RegionUsage

log = logging.getLogger("twine.controld.rebalancer")
INTERVAL = 300.0  # seconds between two rounds of the continuous mode
PER_TXN = 100  # job records a request transaction writes


def enabled(state: RegionState) -> tuple[bool, set[str]]:
    """(on for every entitlement, the entitlements it is on for)."""
    s = state.rebalance_settings.get("") or {}
    return bool(s.get("all")), set(s.get("entitlements") or ())


def view_for(state: RegionState, usage: "RegionUsage | None", entitlements: set[str] | None = None,
             now: float | None = None, measured: dict[tuple[str, int, str], int] | None = None) -> Region:
    """The region's view for a round: every entitlement's groups, or those of `entitlements`
    (the MSBs' capacity always the region's), with the tasks' `measured` figures (measured_for)."""
    return region(state, entitlements, usage.jobs() if usage is not None else None, now, measured)


async def measured_for(usage: "RegionUsage | None", entitlements: set[str] | None = None
                       ) -> dict[tuple[str, int, str], int]:
    """(job, index, machine) -> the millicores each task of the entitlements uses there, smoothed
    over its last half minute or so there (usage/book.py SMOOTHING: a plan and its apply a second
    apart judge a machine alike), from every replica's book (the tasks' figures stay where their
    heartbeats came: usage/peers.py)."""
    if usage is None:
        return {}
    out = {}
    async for some in in_slices(list((await usage.tasks(entitlements=entitlements)).items())):
        out.update((key, t.cpu_avg_m) for key, t in some)
    return out


async def load_planner() -> ModuleType:
    """controlplane.rebalancer.plan, imported in a thread: OR-Tools and what it imports (pandas
    among them) take about a second to load, which on the event loop held the lease's keep-alives
    (a fresh controld's first plan lost it its shard's leadership: the loop held 1.22 s)."""
    return await asyncio.to_thread(importlib.import_module, "controlplane.rebalancer.plan")


async def plan_round(state: RegionState, usage: "RegionUsage | None", entitlements: set[str] | None = None,
                     now: float | None = None, max_moves: int | None = None) -> "Plan":
    """A round's plan: the tasks' figures gathered first, then the view taken on the event loop at
    once (the region's records change under it otherwise), solved in a thread meanwhile.
    `max_moves`: the round's move budget (plan.py)."""
    plan = (await load_planner()).plan  # OR-Tools: loaded at the first plan, not at start
    now = time.time() if now is None else now
    measured = await measured_for(usage, entitlements)
    view = view_for(state, usage, entitlements, now, measured)
    return await asyncio.to_thread(plan, view, cooling=cooling(state.rebalance, now), max_moves=max_moves)


async def request_moves(state: RegionState, p: "Plan", round_id: str, now: float | None = None) -> int:
    """Write the plan's moves as requests, each job's in its rebalance record. What the job was
    asked before and has not begun is replaced (this round's plan was made without it: those tasks
    were left where they are, their targets' room counted as free), and each replaced request
    goes to `recent` as superseded, so it is seen and the task cools down like one dropped.
    Returns how many moves were requested."""
    now = time.time() if now is None else now
    by_job: dict[str, dict[str, dict]] = {}
    for mv in p.moves:
        by_job.setdefault(mv.job, {})[str(mv.index)] = {
            "source": mv.source, "target": mv.target, "goal": mv.goal, "why": mv.why, "round": round_id, "asked": now,
            **({"take": True} if mv.target in p.taken else {})}
    # the records of jobs that are gone (or stopped) go with this round
    gone = sorted(h for h in state.rebalance if (j := state.jobs.get(h)) is None or j.state != "active")
    handles = sorted(by_job) + gone
    for start in range(0, len(handles), PER_TXN):
        batch = handles[start:start + PER_TXN]
        for attempt in range(3):
            guards, puts, deletes = [], {}, []
            for h in batch:
                key = state.keys.rebalance(h)
                if h not in by_job:
                    if h in state.rebalance:
                        guards.append(state.guard(key))
                        deletes.append(key)
                    continue
                old = state.rebalance.get(h) or {}
                guards.append(state.guard(key))
                recent = dict(old.get("recent") or {})
                for i, req in moves_of(old).items():
                    if str(i) not in by_job[h]:
                        recent[str(i)] = {"at": now, "target": req["target"],
                                          "outcome": f"superseded: round {round_id} planned without it"}
                puts[key] = {"requests": by_job[h], "recent": recent}
            try:
                await state.write(guards, puts, deletes)
                break
            except Conflict:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.1)  # a shard leader wrote one of them meanwhile: read it again
    return len(p.moves)


class Continuous:
    """The continuous mode, at the leader of shard 0."""

    def __init__(self, state: RegionState, usage: "RegionUsage", leads_shard_0, interval: float = INTERVAL):
        self.state, self.usage, self.leads = state, usage, leads_shard_0
        self.interval = interval
        self.counters = {"rounds": 0, "requested": 0}
        self.last: dict = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
            except Exception as e:  # noqa: BLE001 - etcd away, OR-Tools missing: the next round tries again
                log.warning("rebalance round: %s: %s", type(e).__name__, e)

    async def round(self, now: float | None = None) -> int:
        every, ents = enabled(self.state)
        if not self.leads() or not (every or ents):
            return 0
        now = time.time() if now is None else now
        chosen = None if every else ents & set(self.state.entitlements)
        p = await plan_round(self.state, self.usage, chosen, now)
        n = await request_moves(self.state, p, f"continuous-{int(now)}", now)
        self.counters["rounds"] += 1
        self.counters["requested"] += n
        self.last = {"at": now, "requested": n, "summary": p.summary()}
        if n:
            log.info("rebalance round: %d move(s) requested: %s", n, "; ".join(p.summary()))
        return n
