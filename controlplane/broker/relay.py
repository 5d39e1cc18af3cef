"""What agents tell one replica, passed on to the replicas that act on it.

An agent heartbeats to one twine-controld process; the heartbeat's two uses live elsewhere:
- *liveness* matters to the machine's health owner (coordination.py, rendezvous hashing): a
  heartbeat that reaches another process is relayed to the owner, and the answer tells the agent
  the owner's URL (`heartbeat_to`), so that it heartbeats there next and relays stay rare; while
  this process's lease is in doubt, its own machines' heartbeats go to the member that takes them
  over too (Coordinator.stand_in);
- the *task report* (and a desired-state error) matters to every shard leader with a task on the
  machine: a report that changed is sent to every other member, and a member that joins gets every
  report this process holds. A member whose key lapsed and came back as the same process (its
  `incarnation`) gets what changed while it was gone, queued for it, instead. Reports change when
  containers do, not with every heartbeat.

- *usage* (controlplane/usage/) matters to every member: each sends the others its sums per job
  and per fleet cell every `usage_every` seconds, whatever changed.

- *how far behind* this process is on its intake (daemon/intake.py) matters to every health owner:
  a heartbeat this process has not read yet is not relayed yet, so an owner measures silence only
  up to the horizon of every member's (health/check.py). A member that says so in its record
  (`intake`: one that hears heartbeats) gets a relay about every BEAT seconds, empty if nothing else
  is owed to it.

One `POST /v1/internal/relay` per peer and interval carries them:
    {"from": member, "seen": [machine id], "reports": {machine id: {"tasks": [...], "error": "", "at": when}},
     "usage": {"jobs": {...}, "cells": [...]}, "behind": seconds}
(`at`: when the member that had the report from the agent last knew it current, wall clock;
`behind`: how far the sender's intake horizon was behind when it sent the relay.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

import aiohttp
import msgspec

from controlplane.broker.agents import NO_TASKS

if TYPE_CHECKING:
    from controlplane.broker.agents import AgentService
    from controlplane.coordination.coordinator import Coordinator
    from controlplane.health.check import HealthService
    from controlplane.store.state import RegionState
    from controlplane.usage.region import RegionUsage

log = logging.getLogger("twine.controld.relay")
INTERVAL = 0.2
USAGE_EVERY = 1.0  # seconds between two usage partials to each member
GONE_FOR = 5  # lease TTLs a member's key may be gone with reports still queued for it
# seconds between two relays to a member that takes `behind`, at most (the health pass's period),
# a relay still out to it aside: an owner measures silence up to the last one, so a verdict waits up
# to this much longer, and the sender's last wait for work (a tick, 0.2 s, at most)
BEAT = 0.5


def _said(task: asyncio.Task) -> None:
    """A relay's end: what _send does not expect is logged, not left unread."""
    if not task.cancelled() and task.exception() is not None:
        log.error("relay failed", exc_info=task.exception())


class Relay:
    def __init__(self, state: "RegionState", agents: "AgentService", health: "HealthService",
                 coordinator: "Coordinator", http: Callable[[], aiohttp.ClientSession], token: str,
                 interval: float = INTERVAL, usage: "RegionUsage | None" = None, usage_every: float = USAGE_EVERY):
        self.state, self.agents, self.health = state, agents, health
        self.coordinator = coordinator
        self.http = http  # the daemon's session to the other replicas (it verifies them with --tls-ca)
        self.token = token  # an API token of this region's: the other replicas' API takes it
        self.interval = interval
        self.usage, self.usage_every = usage, usage_every
        self._usage_sent = 0.0  # monotonic time the last usage partials went
        self.seen: dict[str, set[str]] = {}  # member -> machines heard from since the last send
        self.reports: dict[str, dict[str, dict]] = {}  # member -> machine -> its latest report
        self._members: set[str] = set()
        self._incarnations: dict[str, str | None] = {}  # member -> the process it was when last a member
        self._gone: dict[str, float] = {}  # member whose key went -> when (monotonic): its reports queue meanwhile
        self._failing: dict[str, str] = {}
        self.behind: Callable[[], float] = lambda: 0.0  # this process's intake, behind by (Intake.behind)
        self._beat_sent = 0.0  # monotonic time the last relays went to every member taking `behind`
        self.counters = {"sent": 0, "received": 0, "failures": 0, "seen_relayed": 0, "reports_relayed": 0,
                         "members_gone": 0, "members_back": 0}

    # -- from the heartbeat path -----------------------------------------------------------------

    def heard(self, mid: str) -> None:
        coord = self.coordinator
        owner = coord.owner_of(mid) if coord else None
        if coord is not None and owner == coord.id and not coord.valid():
            # this process may be out of the members already: the one that took the machine over
            # hears of the heartbeat too (else the agent, still answered here, is failed there)
            owner = coord.stand_in(mid)
        if owner is not None and owner != coord.id:
            self.seen.setdefault(owner, set()).add(mid)

    def reported(self, mid: str) -> None:
        """The machine's report (or error) changed here: every other member gets it."""
        coord = self.coordinator
        if coord is None:
            return
        rec = self._report(mid)
        for member in (*self.state.members, *self._gone):
            if member != coord.id:
                self.reports.setdefault(member, {})[mid] = rec

    def _report(self, mid: str) -> dict:
        report = self.agents.reports.get(mid)
        return {"tasks": None if report is None else list(report.values()), "error": self.agents.errors.get(mid, ""),
                "at": self.agents.report_at.get(mid)}

    # -- received ----------------------------------------------------------------------------

    def receive(self, body) -> dict:
        """A peer's relay, decoded into frontend/schema.py's Relay (its fields: seen, reports)."""
        self.counters["received"] += 1
        agents, now, wall = self.agents, time.monotonic(), time.time()
        if body.behind is not None:  # what it heard before then has reached this process by now
            self.health.heard.peer(body.from_, body.behind, bool(body.seen))
        machines = self.state.machines
        for mid in body.seen:
            if (m := machines.get(mid)) is not None:
                mid = m.id  # the region's string for it, not the relay's: kept a machine (issue #38)
                agents.last_seen[mid] = now
                agents.last_seen_wall[mid] = wall
                self.health.seen(mid)
        changed: set[str] = set()
        for mid, rec in body.reports.items():
            if (m := machines.get(mid)) is None:
                continue
            mid = m.id
            if rec.tasks is not None:
                report = {(str(t["job"]), int(t["index"])): t for t in rec.tasks if "job" in t and "index" in t} \
                    or NO_TASKS
                if rec.at is not None and rec.at > agents.report_at.get(mid, 0.0):
                    agents.report_at[mid] = float(rec.at)  # when the receiving member had it from the agent
                if agents.reports.get(mid) != report:
                    agents.reports[mid] = report
                    changed |= self.state.jobs_on(mid) | {job for job, _ in report}
                    self.health.reported(mid)
            error = rec.error or ""
            if agents.errors.get(mid, "") != error:
                agents.errors[mid] = error
                changed |= self.state.jobs_on(mid)
        self.state.changed.set(changed)
        if body.usage is not None and self.usage is not None:
            self.usage.receive(body.from_, body.usage, now)
        return {"ok": True}

    # -- sending -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Every interval, a relay to each peer with something for it. A peer whose last relay is
        still out is passed over (what it is owed waits for the next): one that takes the
        connection and does not answer held every peer's relays for its 2 s timeout, its machines'
        owners hearing of their heartbeats 2 s late."""
        out: dict[str, asyncio.Task] = {}
        try:
            while True:
                await asyncio.sleep(self.interval)
                self._greet_new_members()
                peers = (set(self.seen) | set(self.reports)) - set(self._gone)  # queued until back
                usage = None
                if self.usage is not None and time.monotonic() - self._usage_sent >= self.usage_every:
                    self._usage_sent = time.monotonic()
                    usage = self.usage.partial()
                    peers |= self._members - {self.coordinator.id if self.coordinator else None}
                beat = time.monotonic() - self._beat_sent >= BEAT - self.interval / 2  # (ticks overshoot)
                if beat:
                    self._beat_sent = time.monotonic()
                    peers |= {m for m in self._members if self._takes_behind(m)}  # (a member gone is not in them)
                for p in sorted(peers):
                    if p not in out or out[p].done():
                        out[p] = asyncio.create_task(self._send(p, usage, beat))
                        out[p].add_done_callback(_said)
                for p in [p for p, t in out.items() if t.done() and p not in peers]:
                    del out[p]
        finally:
            for t in out.values():
                t.cancel()

    def _greet_new_members(self) -> None:
        """A member never seen, or a new process under a known id, gets every report this process
        holds. A member whose key went (its lease lapsed: a loop held past the keep-alives, at a
        million machines) and came back as the same process knew them already: it gets what changed
        meanwhile, queued for it, not a greeting of every report (which held loops again, and the
        keys lapsed again). Reports for a member gone for GONE_FOR lease TTLs are dropped."""
        coord = self.coordinator
        members = set(self.state.members)
        now = time.monotonic()
        for member in members - self._members:
            self._gone.pop(member, None)
            inc = self.state.members[member].get("incarnation")
            known = member in self._incarnations and inc is not None and self._incarnations[member] == inc
            self._incarnations[member] = inc
            self.counters["members_back"] += known
            if coord is not None and member != coord.id and not known:
                self.reports.setdefault(member, {}).update({mid: self._report(mid) for mid in self.agents.reports})
        for gone in self._members - members:
            self._gone[gone] = now
            self.counters["members_gone"] += 1
            self.seen.pop(gone, None)  # liveness goes to the machines' owners now
            if self.usage is not None:
                self.usage.forget(gone)  # its sums: the members that hear its machines now count them
        ttl = coord.ttl if coord is not None else 2
        for gone, since in list(self._gone.items()):
            if now - since > GONE_FOR * ttl:
                del self._gone[gone]
                self._incarnations.pop(gone, None)
                self.reports.pop(gone, None)
        self._members = members

    def _takes_behind(self, member: str) -> bool:
        """Its record says it takes `behind` (a member of a version before it refuses the field)."""
        coord = self.coordinator
        return coord is not None and member != coord.id and bool(self.state.members.get(member, {}).get("intake"))

    async def _send(self, member: str, usage: dict | None = None, beat: bool = False) -> None:
        url = self.coordinator.member_url(member) if self.coordinator else None
        seen, reports = self.seen.pop(member, set()), self.reports.pop(member, {})
        behind = self._takes_behind(member)
        if url is None or not (seen or reports or usage or (beat and behind)):
            return
        body = {"from": self.coordinator.id, "seen": sorted(seen), "reports": reports}
        if usage is not None:
            body["usage"] = usage
        if behind:  # read last: what this process had heard before the horizon is in `seen` or sent already
            body["behind"] = round(min(self.behind(), 86_400.0), 3)  # (the schema's bound)
        token = self.token
        try:  # the daemon's session to the other replicas (it verifies them with --tls-ca)
            # msgspec, not aiohttp's json.dumps: a greeting carries every report this process holds
            # (100,000 at 100,000 machines), which json.dumps took 10-19 % of each process's CPU to
            # encode in bench_region_scale (py-spy)
            async with self.http().post(url + "/v1/internal/relay", data=msgspec.json.encode(body),
                                       timeout=aiohttp.ClientTimeout(total=2),
                                       headers={"Authorization": f"Bearer {token}",
                                                "Content-Type": "application/json"}) as r:
                if r.status != 200:
                    raise ValueError(f"HTTP {r.status}: {(await r.text())[:200]}")
            self.counters["sent"] += 1
            self.counters["seen_relayed"] += len(seen)
            self.counters["reports_relayed"] += len(reports)
            if self._failing.pop(member, None):
                log.info("relaying to member %s works again", member)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            self.counters["failures"] += 1
            # liveness is stale by the next interval; reports are not: keep the latest for the next try
            pending = self.reports.setdefault(member, {})
            for mid, rec in reports.items():
                pending.setdefault(mid, rec)
            why = f"{type(e).__name__}: {e}"
            if self._failing.get(member) != why:
                self._failing[member] = why
                log.warning("relaying to member %s at %s failed: %s", member, url, why)
