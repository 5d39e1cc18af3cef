"""A FAKE container runtime for scale simulation and benchmarks only (DESIGN.md allows one, named as
such): it stands in for a thousand agents and their Docker daemons, nothing else.

Per machine it keeps "containers": a task in the machine's desired state (read from the control
plane's own RegionState, woken the way an agent's long poll is) starts, takes `restart_time`
seconds to come up, then runs. It answers the scheduler's `reports(machine)` as the agents'
heartbeats would, and keeps `last_seen` for the real HealthService. A machine can be killed (no
heartbeats, its containers gone) and revived (heartbeats again, empty: it starts what it is given).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from controlplane.store.records import ON_MACHINE
from controlplane.store.state import RegionState


@dataclass
class FakeContainer:
    spec_version: int
    ready_at: float  # monotonic: running from then on


class FakeRuntime:
    def __init__(self, state: RegionState, machines: list[str], restart_time: tuple[float, float],
                 seed: int = 1, tick: float = 0.05):
        self.state = state
        self.machines = machines
        self.restart_time = restart_time
        self.rng = random.Random(seed)
        self.tick = tick
        self.containers: dict[str, dict[tuple[str, int], FakeContainer]] = {m: {} for m in machines}
        self.dead: set[str] = set()
        self.last_seen: dict[str, float] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._running_keys: dict[str, frozenset] = {m: frozenset() for m in machines}

    # -- what the scheduler and the health check read --------------------------------------

    def reports(self, mid: str) -> dict[tuple[str, int], dict] | None:
        if mid in self.dead:
            return None
        now = time.monotonic()
        return {k: {"job": k[0], "index": k[1], "spec_version": c.spec_version,
                    "state": "running" if now >= c.ready_at else "starting"}
                for k, c in self.containers[mid].items()}

    def up(self, job: str) -> dict[int, int]:
        """Task index -> spec version of every container of `job` that runs (ground truth)."""
        now = time.monotonic()
        return {k[1]: c.spec_version for mid, cs in self.containers.items() if mid not in self.dead
                for k, c in cs.items() if k[0] == job and now >= c.ready_at}

    # -- failures --------------------------------------------------------------------------

    def kill(self, mids: list[str]) -> None:
        for mid in mids:
            self.dead.add(mid)
            self.containers[mid] = {}

    def revive(self, mids: list[str]) -> None:
        for mid in mids:
            self.dead.discard(mid)
            self._waiters.pop(mid, None)  # read its desired state afresh

    # -- the agents' loop --------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            changed = False
            for mid in self.machines:
                if mid in self.dead:
                    continue
                self.last_seen[mid] = now
                ev = self._waiters.get(mid)
                if ev is None or ev.is_set():
                    self._waiters[mid] = self.state.machine_changed(mid)
                    changed |= self._apply(mid, now)
                running = frozenset(k for k, c in self.containers[mid].items() if now >= c.ready_at)
                if running != self._running_keys[mid]:
                    self._running_keys[mid] = running
                    changed = True
            if changed:
                self.state.changed.set()  # what a heartbeat with a new task report does
            await asyncio.sleep(self.tick)

    def _apply(self, mid: str, now: float) -> bool:
        if mid not in self.state.machines:
            return False
        desired = {(t["job"], t["index"]): t["spec_version"] for t in self._desired_tasks(mid)}
        have = self.containers[mid]
        changed = False
        for key in list(have):
            if key not in desired:
                del have[key]
                changed = True
        for key, version in desired.items():
            c = have.get(key)
            if c is None or c.spec_version != version:
                have[key] = FakeContainer(version, now + self.rng.uniform(*self.restart_time))
                changed = True
        return changed

    def _desired_tasks(self, mid: str) -> list[dict]:
        # what state.desired_for(mid) lists, without hashing the whole state for a version
        return [{"job": t.job, "index": t.index, "spec_version": t.spec_version}
                for t in self.state.tasks_on(mid) if t.state in ON_MACHINE]
