"""The ops planner's service: maintenance scheduled, listed, shown and ended, each a guarded write
of its event record. What follows from a maintenance (cordons, notices, moves and stops at the
deadline) follows from that record, by the watch, in the scheduler's shards."""

from __future__ import annotations

from dataclasses import replace

from controlplane.opsplanner.maintenance import parse_maintenance
from controlplane.store.records import ApiError, EventRec
from controlplane.store.state import RegionState


class OpsPlanner:
    def __init__(self, state: RegionState, default_policy: str = "move"):
        self.state = state
        self.default_policy = default_policy  # --maintenance-policy: for jobs without a TaskController

    def get(self, event_id: str) -> EventRec:
        e = self.state.events.get(event_id)
        if e is None or e.kind != "maintenance":
            raise ApiError("not_found", "maintenance", f"no maintenance {event_id!r}")
        return e

    def listing(self, everything: bool, now: float) -> list[EventRec]:
        """The maintenance not over (`everything`: over too), by start."""
        events = sorted((e for e in self.state.events.values() if e.kind == "maintenance"), key=lambda e: (e.start, e.id))
        return events if everything else [e for e in events if e.phase(now) != "over"]

    async def schedule(self, spec: dict, now: float) -> EventRec:
        """`spec`: a maintenance's body, its shape checked (schema.MaintenanceSpec)."""
        e = parse_maintenance(spec, self.state.machines, now)
        key = self.state.keys.event(e.id)
        await self.state.write([self.state.guard(key)], {key: e.to_json()})
        self.state.changed.set()
        return self.state.events[e.id]

    async def end(self, event_id: str, now: float) -> EventRec:
        """End a maintenance now: before its deadline this cancels it; during it, its machines are
        back (their suspended tasks start again)."""
        e = self.get(event_id)
        if e.phase(now) == "over":
            raise ApiError("conflict", "maintenance", f"maintenance {e.id} is over already")
        key = self.state.keys.event(e.id)
        await self.state.write([self.state.guard(key)], {key: replace(e, end=now).to_json()})
        self.state.changed.set()
        return self.state.events[e.id]

    def answer(self, e: EventRec, now: float) -> dict:
        tasks = [{"job": t.job, "index": t.index, "machine": t.machine, "state": t.state}
                 for mid in e.machines for t in self.state.tasks_on(mid)]
        return {**e.to_json(), "phase": e.phase(now), "until": e.until,
                "policy": e.policy or self.default_policy, "policy_default": e.policy is None, "tasks": tasks}
