"""The health check service: a machine whose agent misses heartbeats for `timeout` seconds becomes
unhealthy, and a failure event is recorded (one transaction); its tasks are then lost and the
scheduler replaces them, and each leaves a tombstone on the machine (tombstones.py). A machine
whose agent heartbeats again is healthy again, and the event ends, once its agent's report no
longer lists any of those tasks: its moved tasks are no longer in its desired state, so its agent
stops them, and until then the machine stays unhealthy ("stale tasks: ..."), in its entitlement,
granted to nobody else.

Heartbeat times are kept in memory only. A restarted daemon has none, so it gives every machine a
full timeout from its own start before judging it; a machine registered later, the same from when
this process first sees it.

With several replicas, each judges only the machines it owns (coordination.py: rendezvous hashing
over the members with the health role); heartbeats that reach another replica are relayed to the
owner (broker/relay.py). A machine a replica comes to own (a member joined or left) gets the same
grace from that moment: its heartbeats went to the old owner until then. So does every machine not
heard from when the replica joins the members, and every machine when it joins them again after
its lease lapsed (a new lease): while it was out of them, nobody relayed it a heartbeat.

Silence is measured up to when this process has heard its machines' heartbeats (horizon.py): a
heartbeat waiting unread here, or at a member that relays it heartbeats, is not silence, for up to
a timeout's doubt.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

from controlplane.health import tombstones
from controlplane.health.horizon import STUCK, HeardUpTo
from controlplane.store.records import EventRec, MachineRec
from controlplane.store.state import RegionState
from controlplane.store import Store, Unavailable
from controlplane.store.keys import Keys

log = logging.getLogger("twine.controld.health")
NO_HEARTBEAT = "no heartbeat"
# machines whose health owner is computed between two turns of the event loop: about 9 ms at 4
# members here, alone. 20,000 held the loop 0.7-2 s a slice in bench_region_scale at a million
# machines, four processes computing at once on two cores beside etcd, past the 2 s lease
OWNERS_SLICE = 2_000
DROP_SLICE = 20_000  # machines no longer owned forgotten between two turns of the loop (_drop)
# machines a pass looks at between two turns of the event loop: at a million machines, a third of
# them due at once (the silent ones' fallback look, or all of them when a process comes to own
# them) took seconds in one go, while heartbeats waited unread and the lease's keep-alive too.
# 2,000 a turn was still 11-16 ms of CPU there (25-44 ms of wall time, four daemons and etcd on two
# cores: bench_region_scale, a pass timed slice by slice), the loop's longest turns in its stall
# watcher's stacks; 500 is 3-6 ms
EXAMINE_SLICE = 500
# machines failed in one transaction at most, whatever etcd's --max-txn-ops allows (our installers
# set 65536, and 32 MiB a request): a record and an event each, under 1 KB, so a DC's worth of
# machines falling silent at once is written in transactions of about half a megabyte, not 30 MB
# (and in 64s at etcd's default 128 operations)
FAIL_BATCH = 500
IN_MAINTENANCE = " (in maintenance "  # tags, for people, the reason of a machine silent during its maintenance
Report = Mapping[tuple[str, int], Any]


def _recoverable(m: MachineRec) -> bool:
    """Unhealthy for a reason its agent's return ends: silence, or tombstones still reported."""
    return not m.healthy and m.health_reason.startswith((NO_HEARTBEAT, tombstones.STALE))


def cleared(rec: MachineRec, report: Report | None, at: float | None, tasks: int, forget: bool = False) -> MachineRec:
    """The record of a machine just heard from (`report`: its agent's latest task report, None if
    this process has none yet; `at`: when it was last known current): the tombstones the report no
    longer lists dropped (tombstones.gone); healthy again if it was unhealthy for silence or
    tombstones and none are left, else unhealthy for them. `forget`: an admin's word that none of
    its tombstones runs; a silent machine stays unhealthy. `tasks`: the tasks on it (the region
    view's count, RegionState.tasks_held): one left holding none and no tombstone returns to the
    free pool."""
    new = tombstones.drop(rec, rec.tombstones if forget else tombstones.gone(rec, report, at), tasks)
    if _recoverable(rec) and not (forget and rec.health_reason.startswith(NO_HEARTBEAT)):
        new = replace(new, healthy=not new.tombstones, health_reason=tombstones.reason(new) if new.tombstones else "")
    return new


class HealthService:
    def __init__(self, state: RegionState, store: Store, keys: Keys, last_seen: dict[str, float], timeout: float = 5.0,
                 max_txn_ops: int = 128):
        self.state = state
        self.max_txn_ops = max_txn_ops  # etcd's --max-txn-ops: the machines failed in one transaction
        self.store = store
        self.keys = keys
        self.last_seen = last_seen
        self.timeout = timeout
        self.started = time.monotonic()
        # A restarted daemon has no heartbeat times: it waits a timeout plus an agent's longest
        # retry gap (its backoff is capped at 5 s) before it judges anyone.
        self.grace = timeout + 5.0
        self._returning: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.counters = {"failures": 0, "recoveries": 0, "examined": 0}
        self.coordinator = None  # replicas: judge only the machines this process owns
        self._owned: set[str] = set()
        self._members: tuple[str, ...] = ()
        self._owned_key: tuple = ()
        self._adopted: dict[str, float] = {}  # machine -> when this process came to own it
        # the lease this process last judged under; when it first joined the members (a machine
        # never heard from is silent since then at the earliest: no relay came here before), and
        # when it last joined them again after its lease lapsed (every machine's silence counts
        # from then at the earliest: no relay came here meanwhile)
        self._lease: object = None
        self._joined = self._rejoined = 0.0
        self._heap: list[tuple[float, str]] = []  # (when to look at it, machine): one live entry a machine
        self._due: dict[str, float] = {}  # machine -> the due time of its live entry
        self._fresh: set[str] = set()  # machines this process came to own, due at once (_own), not in the heap
        self._fresh_at = 0.0  # when the oldest of them came
        # owned machines last looked at before their first heartbeat (due at the end of the grace):
        # their first heartbeat brings their deadline forward to a timeout after it
        self._unheard: set[str] = set()
        # owned machines unhealthy and silent past their limit, out of the heap until heard (check())
        # or their record turns healthy (another member cleared it while the owners changed)
        self._dormant: set[str] = set()
        state.on_healthy.append(self._woken)
        # machine -> its agent's latest task report and when it was last known current
        # (AgentService.report_with_time), for its tombstones
        self.report_of: Callable[[str], tuple[Report | None, float | None]] = lambda mid: (None, None)
        # up to when silence is measured: this process's intake horizon (Intake.horizon) and its peers'
        self.heard = HeardUpTo()

    async def run(self) -> None:
        self.started = time.monotonic()  # the clock starts when the API listens, not at construction
        last_error = ""
        while True:
            await asyncio.sleep(min(self.timeout / 4, 0.5))
            try:
                await self.check()
                last_error = ""
            except Exception as e:  # the next pass tries again (a failed batch too): said once while it repeats
                said = f"{type(e).__name__}: {e}"
                if said != last_error:
                    if isinstance(e, Unavailable):
                        log.warning("health check pass: %s", e)
                    else:
                        log.exception("health check pass failed")
                last_error = said

    async def _refresh_owned(self, now: float) -> bool:
        """The machines this process judges, recomputed only when the members with the health
        role or the set of machines changed; False while it may not judge anyone (cut off from
        etcd: its view of the region, and of who owns what, may be stale)."""
        coord = self.coordinator
        if coord is None:
            key: tuple = ((), self.state.machines_version)
            if key != self._owned_key:
                changed = self.state.machines_changed(self._owned_key[1]) if self._owned_key else None
                if changed is None:  # at first (or after more changes than the region's log holds)
                    owned = set(self.state.machines)
                else:  # the machines that came or went since, not a set of every machine compared
                    machines = self.state.machines
                    owned = (self._owned - changed) | {mid for mid in changed if mid in machines}
                if self._owned_key:
                    self._welcome(owned - self._owned, now)
                for mid in self._owned - owned:
                    self._adopted.pop(mid, None)
                    self._dormant.discard(mid)
                self._owned_key = key
                self._own(owned, now)
            return True
        if not coord.valid():
            return False
        if coord.lease != self._lease:  # a member from now on, for the first time or again
            if self._lease is None:
                self._joined = now
            else:
                self._rejoined = now
            self._lease = coord.lease
        members = coord.health_members()
        key = (members, self.state.machines_version)
        if key == self._owned_key:  # nothing changed who owns what: no pass over the region
            return True
        # machines came or went, the owners did not change: only those are looked at (the region's
        # log of them, RegionState.machines_changed), else every machine's owner
        changed = self.state.machines_changed(self._owned_key[1]) \
            if self._owned_key and self._owned_key[0] == members else None
        if changed is not None:
            machines = self.state.machines
            owned = (self._owned - changed) | set(coord.owned_among([mid for mid in changed if mid in machines], members))
        else:
            # every machine's owner, in slices that let the loop run in between (a million
            # machines take seconds: the lease's keep-alive must not wait for them)
            ids, owned = list(self.state.machines), set()
            for i in range(0, len(ids), OWNERS_SLICE):
                owned.update(coord.owned_among(ids[i:i + OWNERS_SLICE], members))
                await asyncio.sleep(0)
            if coord.health_members() != members:
                return False  # they changed meanwhile: computed again at the next pass
            # (a lease in doubt meanwhile changes nothing of who owns what among these members: kept.
            # Thrown away, a pass that outlasts the time between two lapses never ended, and at a
            # million machines its own seconds of work held the loop into the next lapse)
            # machines that came meanwhile are not in `ids`: the next pass takes them (the
            # version below is the one `ids` was read at); those gone meanwhile go then
        first = not self._owned_key
        self._owned_key = key
        self._members = members
        if not first:
            # machines come to this process: new to the region (silent since now: _welcome), or,
            # the owners changed, heartbeating to another member until now: judged from now on
            self._welcome(owned - self._owned, now)
        await self._drop(self._owned - owned)
        self._own(owned, now)
        # judged while the lease is not in doubt only, and not before the next pass when it was
        # renewed meanwhile (that pass sets the floor of a new lease, above)
        return coord.valid() and coord.lease == self._lease

    def _welcome(self, new: set[str], now: float) -> None:
        """Machines new to the region (registered since this process started): silent since now,
        not since the daemon started, so each has the grace for its first heartbeat. Without it a
        machine registered after the daemon had run longer than the grace failed in the first
        pass that looked at it unless its first heartbeat (or its relay) had come before."""
        self._adopted.update(dict.fromkeys(new, now))

    async def _drop(self, lost: set[str]) -> None:
        """Forget the machines this process no longer judges. At a million machines the first
        process up owns them all, and loses three quarters of them as the others join: a pop from
        each of the three for every one of them held the loop for 0.73 s (bench_region_scale's
        stall watcher), past a third of the lease. The sets go in one pass each in C; the machines
        adopted in slices with the loop let run between them (meanwhile heartbeats only take
        machines out of these, and nothing else adds to them: check() is waiting on this)."""
        self._unheard -= lost
        self._dormant -= lost
        adopted = self._adopted
        common = list(adopted.keys() & lost)
        for i in range(0, len(common), DROP_SLICE):
            if i:
                await asyncio.sleep(0)
            for mid in common[i:i + DROP_SLICE]:
                adopted.pop(mid, None)

    def _own(self, owned: set[str], now: float) -> None:
        """Judge `owned` from now on: the machines new to it are looked at in the next pass, which
        computes their deadlines. They wait in a set (`_fresh`), not as entries of the heap: at a
        million machines a process came to own a third of them at once, and an entry each (a
        tuple, and a heap push) held the loop for 1.2-1.8 s, past the lease's keep-alive
        (bench_region_scale; the stalls watcher's stack): each of the ~480 young collections
        the tuples set off went through the large young lists of that moment. A set: a machine
        owned, lost and owned again before a pass is in it once."""
        new = owned - self._owned
        if new:
            if not self._fresh:
                self._fresh_at = now
            self._fresh |= new
        self._owned = owned

    def _push(self, mid: str, due: float) -> None:
        self._due[mid] = due
        heapq.heappush(self._heap, (due, mid))

    async def check(self) -> None:
        """Look at the machines whose deadline has come, not at every machine: each owned machine
        has one entry in a heap, due when its silence would pass its limit (as of its last
        heartbeat when it was last looked at), or, just come to this process, waits in `_fresh`,
        due at once (after the heap's entries due before it came). A machine that heartbeated
        meanwhile is put back with its new deadline; one still silent fails. So a pass costs the
        machines due, about owned / timeout a second in all, where a pass over every machine
        twice a second cost the region. An unhealthy machine comes back by its next heartbeat
        (seen()); it is looked at again once a timeout, a fallback."""
        now = time.monotonic()
        if not await self._refresh_owned(now):
            return
        heard = self.heard.at(now, self.coordinator, self.state.members, self.timeout)
        heap, due_of = self._heap, self._due
        # (machine, reason, seconds silent, its last heartbeat then): written together after the
        # pass (an MSB's machines fail at once)
        failing: list[tuple[str, str, float, float | None]] = []
        error: Exception | None = None
        examined = 0
        fresh = self._fresh
        while fresh or (heap and heap[0][0] <= now):
            examined += 1
            if examined % EXAMINE_SLICE == 0:
                # heartbeats that came meanwhile are heard before the machines after them are judged
                await asyncio.sleep(0)
                now = time.monotonic()
                heard = self.heard.at(now, self.coordinator, self.state.members, self.timeout)
                coord = self.coordinator
                if coord is not None and (not coord.valid() or coord.health_members() != self._members):
                    break  # who owns what may have changed: the next pass judges (the rest stay due)
                continue
            if fresh and not (heap and heap[0][0] <= self._fresh_at):  # the ones due before them first
                mid = fresh.pop()  # an entry it may have in the heap is replaced by the one pushed below
            else:
                due, mid = heapq.heappop(heap)
                if due_of.get(mid) != due:
                    continue  # an entry replaced by a later one
                del due_of[mid]
            m = self.state.machines.get(mid)
            if m is None or mid not in self._owned:
                continue  # gone, or another member judges it now (it is pushed again if it comes back)
            self.counters["examined"] += 1
            seen = self.last_seen.get(mid)
            since = max(self.started, self._rejoined, self._adopted.get(mid, self.started),
                        self._joined if seen is None else 0.0)
            # silent up to the intake horizon: a heartbeat unread then is not silence
            if seen is None or seen < since:  # not heard from since this daemon started, or came to own it
                silent, limit = heard - since, self.grace
                self._unheard.add(mid)
            else:
                silent, limit = heard - seen, self.timeout
                self._unheard.discard(mid)
                if mid in self._adopted:  # heard from since: judged by its heartbeats alone
                    del self._adopted[mid]
            if m.healthy and silent > limit:
                failing.append((m.id, f"{NO_HEARTBEAT} for {silent:.1f}s", silent, seen))
            elif _recoverable(m) and seen is not None and now - seen <= self.timeout \
                    and cleared(m, *self.report_of(mid), self.state.tasks_held(mid)) != m:
                try:
                    await self._clear(m.id)
                except Exception as e:  # the machines found silent in this pass still fail now
                    error = error or e
            elif not m.healthy and m.health_reason.startswith(tombstones.STALE) and silent > limit:
                failing.append((m.id, f"{NO_HEARTBEAT} for {silent:.1f}s", silent, seen))  # back with tombstones, silent again
            # An unhealthy machine silent past its limit (not one back with tombstones, failed again
            # above) waits for its next heartbeat outside the heap (dormant; seen() puts it back):
            # nothing a look could do for it before. At a million machines, most of them down, a
            # look a timeout at each was 7,500 looks a second in every replica, and a tuple and a
            # float each in its heap (issue #38).
            if not m.healthy and silent > limit and not m.health_reason.startswith(tombstones.STALE):
                self._dormant.add(mid)
                continue
            # a healthy machine: due when its silence passes the limit (with the horizon stuck, not
            # before it may have moved on: a machine due at once would be looked at in every pass
            # while it stays stuck); an unhealthy one still heard, a timeout on (it comes back by its
            # heartbeats: seen(), reported())
            lag = now - heard
            self._push(mid, now + max(limit - silent + 0.001, min(lag, self.timeout / 4) if lag > STUCK else 0.0)
                       if m.healthy and silent <= limit else now + self.timeout)
        if not fresh and fresh is self._fresh:
            # drained: a set keeps the table it grew to (a process came to own a third of a million
            # machines at once: 21 bytes a machine of the region, held for good); a new one is empty
            self._fresh = set()
        if self.coordinator is not None and not self.coordinator.valid():  # the lease in doubt: judged later
            for mid, *_ in failing:
                self._push(mid, now)
            failing = []
        batch = max(1, min(FAIL_BATCH, self.max_txn_ops // 2))  # a record and an event a machine; as many compares
        for i in range(0, len(failing), batch):
            try:
                await self._fail(failing[i:i + batch])
            except Exception as e:  # the other batches still fail now; this one is looked at again next pass
                error = error or e
                for mid, *_ in failing[i:i + batch]:
                    self._push(mid, now)
        if error is not None:
            raise error

    def _woken(self, mid: str) -> None:
        """A machine's record turned healthy: a dormant one is looked at in the next pass."""
        if mid in self._dormant:
            self._dormant.discard(mid)
            if mid in self._owned:
                self._push(mid, time.monotonic())

    def seen(self, mid: str) -> None:
        """Called on every heartbeat: a machine marked unhealthy for silence is healthy again (once
        its tombstones are gone); a machine heard from for the first time is judged a timeout from
        now, not at the grace's end."""
        if mid in self._unheard or mid in self._dormant:
            self._unheard.discard(mid)
            self._dormant.discard(mid)
            if mid in self._owned:
                self._push(mid, time.monotonic() + self.timeout + 0.001)
        self.reported(mid)

    def reported(self, mid: str) -> None:
        """Called on a heartbeat and when the machine's task report changed (here or relayed): the
        machine's owner clears its record when that would change it (cleared()), which a
        heartbeat of a healthy machine without tombstones never does (a dict lookup)."""
        m = self.state.machines.get(mid)
        if m is None or mid not in self._owned or mid in self._returning or not _recoverable(m) \
                or cleared(m, *self.report_of(mid), self.state.tasks_held(mid)) == m:
            return
        self._returning.add(mid)
        task = asyncio.get_running_loop().create_task(self._recover(mid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self, mid: str) -> None:
        try:
            await self._clear(mid)
            m = self.state.machines.get(mid)
            if mid in self._owned and m is not None and m.healthy:
                # judged again from its heartbeat on, not a fallback's timeout later
                self._push(mid, self.last_seen.get(mid, time.monotonic()) + self.timeout + 0.001)
        finally:
            self._returning.discard(mid)

    async def clean(self, mid: str) -> None:
        """An admin's `machine clean`: the machine runs none of its tombstones (it was wiped, or is
        gone for good): they are dropped and their resources freed."""
        await self._clear(mid, forget=True)

    async def _clear(self, mid: str, forget: bool = False) -> None:
        """Write cleared(): tombstones dropped (their resources freed; the machine back in the free
        pool when it holds nothing more, its entitlement's record rewritten like the scheduler's),
        health back, the failure event ended."""
        m = self.state.machines.get(mid)
        if m is None:
            return
        key = self.keys.machine(mid)
        ekey = self.keys.entitlement(m.entitlement) if m.entitlement else None
        report, at = self.report_of(mid)
        now = time.time()
        open_events = self.state.open_failures(mid)
        done: dict[str, MachineRec] = {}

        def compute(reads):
            cur = reads[key].value
            if cur is None:
                return {}, []
            rec = MachineRec.from_json(cur)
            if rec.entitlement != m.entitlement:
                return {}, []  # this view is behind etcd: the next heartbeat clears it
            new = cleared(rec, report, at, self.state.tasks_held(mid), forget)
            if new == rec:
                return {}, []
            done.update(old=rec, new=new)
            puts = {key: new.to_json()}
            if new.healthy and not rec.healthy:
                for e in open_events:
                    puts[self.keys.event(e.id)] = replace(e, end=now).to_json()
            if ekey is not None and new.entitlement is None and reads[ekey].value is not None:
                puts[ekey] = reads[ekey].value  # a change to what it holds writes its record (service.py)
            return puts, []

        rev = await self.store.update([key] + ([ekey] if ekey else []), compute)
        if not rev:
            return
        await self.state.wait_for(rev)
        old, new = done["old"], done["new"]
        if len(new.tombstones) < len(old.tombstones):
            log.info("machine %s: %d tombstone(s) gone, %d left%s", mid, len(old.tombstones) - len(new.tombstones),
                     len(new.tombstones), "; back in the free pool" if old.entitlement and not new.entitlement else "")
        if new.healthy and not old.healthy:
            self.counters["recoveries"] += 1
            log.warning("machine %s is healthy again", mid)

    async def _fail(self, failing: list[tuple[str, str, float, float | None]]) -> None:
        """Each machine (id, reason, seconds silent, its last heartbeat when it was found silent)
        that has not heartbeated since (the pass's other writes came between) is unhealthy for
        its reason, all in one
        transaction (issue #12: one transaction a machine, waited in turn, took an MSB of 50
        machines 2.6 s past the first); check() sizes the batches by max_txn_ops and FAIL_BATCH; a failure event opens for each unless it is in maintenance
        (or was unhealthy already: back with tombstones, then silent again, it only says so). The
        event starts when the machine was last heard from: as near as the daemon knows, when it
        failed (for one not heard from since this daemon started or came to judge it, then)."""
        now = time.time()
        reasons: dict[str, tuple[str, str | None, float]] = {}
        for mid, reason, silent, seen in failing:
            if self.last_seen.get(mid) != seen:
                # it heartbeated after it was found silent (the pass let heartbeats in, or the
                # pass's other writes came between): looked at again at once
                self._push(mid, time.monotonic())
                continue
            maint = self.state.maintenance.of(mid, now)
            if maint is not None and maint.phase(now) == "in progress":
                # expected: the machine is in maintenance; it is down, but that is no failure
                reasons[mid] = (f"{reason}{IN_MAINTENANCE}{maint.id})", maint.id, silent)
            else:
                reasons[mid] = (reason, None, silent)
        if not reasons:
            return
        key_of = {mid: self.keys.machine(mid) for mid in reasons}
        written: dict[str, bool] = {}  # machine -> it was healthy

        def compute(reads):
            written.clear()
            puts = {}
            for mid, (reason, maint_id, silent) in reasons.items():
                cur = reads[key_of[mid]].value
                if cur is None:
                    continue
                rec = MachineRec.from_json(cur)
                if not rec.healthy and not rec.health_reason.startswith(tombstones.STALE):
                    continue
                written[mid] = rec.healthy
                puts[key_of[mid]] = replace(rec, healthy=False, health_reason=reason).to_json()
                if rec.healthy and maint_id is None:
                    eid = f"failure-{mid}-{int(now * 1000)}"
                    puts[self.keys.event(eid)] = EventRec(eid, "failure", (mid,), now - silent, reason, created=now).to_json()
            return puts, []

        rev = await self.store.update(list(key_of.values()), compute)
        if not rev:
            return
        await self.state.wait_for(rev)
        for mid, was_healthy in written.items():
            if was_healthy:
                self.counters["failures"] += 1
            log.warning("machine %s is unhealthy: %s", mid, reasons[mid][0])
