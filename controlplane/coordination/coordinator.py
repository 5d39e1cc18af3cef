"""Replicas of twine-controld in one region: membership, shard leadership, health ownership.

Every process holds an etcd lease (`--lease-ttl`, default 2 s) that it keeps alive, and a member
record attached to it (/twine/<region>/members/<id>: its URL, roles, shards). When a process dies
its lease expires and its records go with it.

**Shard leaders.** A scheduler shard has one leader: the process whose record sits at
/twine/<region>/leaders/<shard>, put with the process's lease only if absent (etcd's election
recipe). The leader alone runs the shard's scheduler and TaskControl sessions. The mod revision of
that put is the leadership's *epoch*; every write the shard's scheduler makes is guarded by it (the
fence): once the key is gone (lease expired) or someone else's, a deposed leader's commit fails.

A leader also stops acting on its own before its lease can have ended: the lease is valid for
TTL seconds from the sending of the last keep-alive etcd answered; `margin` before that, with no
newer answer, the process gives up every shard it leads (a process cut off from etcd stops
calling TaskControllers and scheduling before anyone else can be elected). When its event loop was
held past that moment, a keep-alive's answer that came meanwhile is read first (up to half the
margin later, counted in `lease_answers_awaited_late`): the loop held, the process did not act.

Shards are spread: a process campaigns for a shard that has no leader when it leads fewer than its
fair share (shards / scheduler members), or when the shard has been leaderless for `fair_wait`
seconds (so no shard stays without a leader). A process that leads at least two more shards than
another member that may lead them hands one over every `handover_wait` seconds (its leadership
ends, then its key is deleted), so a member that joins later takes its part.

**Health ownership.** Machines are spread over the members with the health role by rendezvous
hashing: one owner judges a machine's heartbeats. Heartbeats that reach another member are relayed
to the owner (broker/relay.py), and agents are told the owner's URL in the heartbeat answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

from controlplane.store import Store, Versioned
from controlplane.store.keys import Keys

log = logging.getLogger("twine.controld.coordination")
ROLES = ("frontend", "scheduler", "health")
HELD = 0.05  # s: a keep-alive's timeout that ran this late ran after the loop was held
SUSPECT_AFTER = 2  # keep-alives in a row unanswered before the etcd member in use is taken for cut off


@dataclass(frozen=True)
class Fence:
    """A shard leadership: every write of the shard's scheduler carries `guard`."""

    shard: int
    epoch: int  # the mod revision of the leader key's put
    key: str

    @property
    def guard(self) -> Versioned:
        return Versioned(self.key, None, self.epoch)


def parse_roles(text: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in text.split(",") if r.strip())
    bad = [r for r in roles if r not in ROLES]
    if bad or not roles:
        raise ValueError(f"{text!r}: roles are a comma-separated subset of {', '.join(ROLES)}")
    return roles


def parse_shards(text: str, count: int) -> tuple[int, ...]:
    """`0-3,7` -> (0, 1, 2, 3, 7); `all` -> every shard of the region."""
    if text.strip() in ("", "all"):
        return tuple(range(count))
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ValueError(f"{part!r}: shards are N or N-M, comma-separated") from None
        if a > b or a < 0:
            raise ValueError(f"{part!r}: not a range of shard numbers")
        out.update(range(a, b + 1))
    beyond = sorted(s for s in out if s >= count)
    if beyond:
        raise ValueError(f"shard(s) {', '.join(map(str, beyond))}: the region has {count} shard(s), 0-{count - 1}")
    return tuple(sorted(out))


_PREFIXES: dict[str, "hashlib._Hash"] = {}  # member -> its hash state after "member\0" (members are few)


def _prefix(member: str) -> "hashlib._Hash":
    h = _PREFIXES.get(member)
    if h is None:
        if len(_PREFIXES) > 4096:
            _PREFIXES.clear()
        h = _PREFIXES[member] = hashlib.blake2b(f"{member}\0".encode(), digest_size=8)
    return h


def rendezvous(member_ids: Sequence[str], key: str) -> str | None:
    """The member that owns `key`: highest hash of (member, key), blake2b of "member\0key". A
    member leaving moves only its own keys. (The hash of "member\0" is taken once and copied:
    the same digest at less than half the cost, which a million machines' owners need.)"""
    k = key.encode()
    best, best_h = None, b""
    for m in member_ids:
        h = _prefix(m).copy()
        h.update(k)
        d = h.digest()
        if best is None or d > best_h:
            best, best_h = m, d
    return best


class Coordinator:
    """This process's membership and leaderships. The daemon passes `lead(fence)` and
    `depose(shard, why)`, called as leaderships begin and end."""

    def __init__(self, store: Store, keys: Keys, state, url: str, roles: tuple[str, ...], shards: tuple[int, ...],
                 lead: Callable[[Fence], Awaitable[None]], depose: Callable[[int, str], Awaitable[None]],
                 ttl: int = 2, member_id: str | None = None, fair_wait: float = 1.0, handover_wait: float = 5.0):
        self.store = store
        self.keys = keys
        self.state = state  # RegionState: members and leaders as the watch has them
        self.url = url
        self.roles = roles
        self.shards = shards  # the shards this process may lead
        self.id = member_id or uuid.uuid4().hex[:12]
        # this process, whatever its id (an id may be configured, and kept by a restarted process):
        # a member back with the same incarnation after its lease lapsed kept everything it knew
        self.incarnation = uuid.uuid4().hex
        self.ttl = ttl
        self.margin = ttl / 4
        self.fair_wait = fair_wait
        self.handover_wait = handover_wait  # seconds between two shards this process hands over
        self._last_handover = time.monotonic()  # none in a process's first handover_wait either
        # shard -> (when this process handed it over, that leadership's epoch: never taken up again)
        self._handed: dict[int, tuple[float, int]] = {}
        self._lead, self._depose = lead, depose
        self.lease: int | None = None
        self.valid_until = 0.0  # monotonic: the lease is surely alive until then
        self.leading: dict[int, Fence] = {}
        self._leaderless_since: dict[int, float] = {}
        self.counters = {"elections_won": 0, "depositions": 0, "lease_renewals": 0, "lease_failures": 0,
                         "lease_answers_awaited_late": 0, "handovers": 0}
        self._health_members: tuple[int, tuple[str, ...]] = (-1, ())
        self._others: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # health members, and they less this one
        self.closing = False

    # -- queries -----------------------------------------------------------------------------

    def valid(self) -> bool:
        return self.lease is not None and time.monotonic() < self.valid_until - self.margin

    def leads(self, shard: int) -> bool:
        return shard in self.leading

    def leader_url(self, shard: int) -> str | None:
        cur = self.state.leaders.get(shard)
        return None if cur is None else cur.value.get("url")

    def health_members(self) -> tuple[str, ...]:
        """Sorted; recomputed only when the members change (this is on every heartbeat's path)."""
        if self._health_members[0] != self.state.members_version:
            self._health_members = (self.state.members_version, tuple(sorted(
                mid for mid, m in self.state.members.items() if "health" in m.get("roles", ()))))
        return self._health_members[1]

    def owner_of(self, machine_id: str) -> str | None:
        """The member that judges this machine's health (None: no member has the health role)."""
        return rendezvous(self.health_members(), machine_id)

    def stand_in(self, machine_id: str) -> str | None:
        """The member that judges the machine once this process is out of the members: while its
        lease is in doubt the others may have taken its machines over already, and its own view of
        the members may be stale (cut off from etcd, its watch stalls and still shows it)."""
        members = self.health_members()
        if self._others[0] != members:
            self._others = (members, tuple(m for m in members if m != self.id))
        return rendezvous(self._others[1], machine_id)

    def owns(self, machine_id: str) -> bool:
        return "health" in self.roles and self.owner_of(machine_id) == self.id

    def owned_among(self, machine_ids: Sequence[str], members: tuple[str, ...]) -> list[str]:
        """Those of the machines this process judges (owns(), for many at once), among `members`
        (a pass in slices gives the ones it began with)."""
        if "health" not in self.roles:
            return []
        return [mid for mid in machine_ids if rendezvous(members, mid) == self.id]

    def member_url(self, member_id: str) -> str | None:
        m = self.state.members.get(member_id)
        return None if m is None else m.get("url")

    def answer(self) -> dict:
        return {"member": self.id, "url": self.url, "roles": list(self.roles), "shards": list(self.shards),
                "leading": sorted(self.leading), "lease_valid_for": round(max(0.0, self.valid_until - time.monotonic()), 3)}

    # -- the loops ---------------------------------------------------------------------------

    async def run(self) -> None:
        await self._join()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._keepalive())
            if "scheduler" in self.roles:
                tg.create_task(self._campaign())

    async def _join(self) -> None:
        """A new lease and the member record on it; retried until etcd answers."""
        delay = 0.1
        while True:
            try:
                sent = time.monotonic()
                lease = await asyncio.wait_for(self.store.grant(self.ttl), self.ttl)
                rec = {"id": self.id, "url": self.url, "roles": list(self.roles), "shards": list(self.shards),
                       "started": time.time(), "lease": lease, "incarnation": self.incarnation,
                       # takes and sends `behind` in relays (broker/relay.py): a member that hears heartbeats
                       "intake": "frontend" in self.roles or "health" in self.roles}
                await asyncio.wait_for(self.store.put_leased(self.keys.member(self.id), rec, lease), self.ttl)
                self.lease, self.valid_until = lease, sent + self.ttl
                await self._bury_predecessors()
                log.info("member %s joined region %s (lease %x, ttl %ds, roles %s)", self.id, self.keys.region,
                         lease, self.ttl, ",".join(self.roles))
                return
            except Exception as e:  # etcd down: keep trying; nothing is led meanwhile
                log.warning("member %s cannot join yet: %s: %s", self.id, type(e).__name__, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _bury_predecessors(self) -> None:
        """A member at our URL that is not us is a predecessor that died (we listen there now):
        revoking its lease ends its membership and leaderships at once, not a TTL later. So a
        daemon restarted by systemd leads again at once. (--advertise must be unique per process.)"""
        for mid, m in list(self.state.members.items()):
            if mid != self.id and m.get("url") == self.url and m.get("lease"):
                try:
                    await asyncio.wait_for(self.store.revoke(int(m["lease"])), self.ttl)
                    log.warning("member %s at our URL %s was a predecessor of this process: its lease is revoked",
                                mid, self.url)
                except Exception as e:  # already expired: nothing to do
                    log.info("predecessor %s: %s", mid, e)

    async def _keepalive(self) -> None:
        sent = time.monotonic()
        unanswered = 0  # keep-alives in a row that timed out
        while not self.closing:
            # a quarter of the TTL after the last one was sent (at once when its answer was late)
            await asyncio.sleep(max(0.0, sent + self.ttl / 4 - time.monotonic()))
            if self.leading and not self.valid():  # ran out while the loop slept or was held
                await self._depose_all(self._in_doubt())
            sent = time.monotonic()
            try:
                left = await self._refresh(sent)
                unanswered = 0
            except Exception as e:
                self.counters["lease_failures"] += 1
                log.warning("lease keep-alive failed: %s: %s", type(e).__name__, e)
                left = None
                unanswered = unanswered + 1 if isinstance(e, TimeoutError) else 0
                if unanswered and unanswered % SUSPECT_AFTER == 0:  # the member in use may be cut off: another one answers
                    await self.store.suspect(f"{unanswered} lease keep-alives unanswered")
            if left is not None and left > 0:
                self.valid_until = sent + left
                self.counters["lease_renewals"] += 1
            elif left is not None:  # etcd says the lease is gone: so are our records
                await self._depose_all("the lease expired")
                self.lease = None
                await self._join()
                continue
            if self.leading and not self.valid():
                await self._depose_all(self._in_doubt())

    def _in_doubt(self) -> str:
        # valid_until - ttl: about when the last keep-alive etcd answered was sent
        return (f"no keep-alive answered for {time.monotonic() - (self.valid_until - self.ttl):.1f}s; "
                "the lease may be about to end")

    async def _refresh(self, sent: float) -> int:
        """One keep-alive. While this process leads a shard, its answer is waited for until the
        lease stops being valid (`margin` before it can end: the shards are given up then);
        else for a third of the TTL. An answer that came while the event loop was held (a long
        turn, a full collection) sits unread until the loop runs again, and the timeout's
        callback may run first: thrown away, it cost every leadership of a process at a million
        machines (bench_region_scale: a turn of 0.7-0.9 s). So when the timeout ran late (the
        loop was held), the answer gets half the margin to be read before it counts as missing (a
        few turns of the loop were not enough for gRPC's poller to hand it over, nor was a tenth of
        the margin, 50 ms at --lease-ttl 2, on a host with a VM region booting beside it). Meanwhile
        the process does not act as leader (valid() is false past valid_until - margin) and its
        commits stay fenced by the leader key.
        Whenever it came, it renewed the lease from its sending on; and while the loop was held,
        the process did not act."""
        wait = self.valid_until - self.margin - sent if self.leading else self.ttl / 3
        refresh = asyncio.ensure_future(self.store.refresh(self.lease))
        try:
            done, _ = await asyncio.wait({refresh}, timeout=max(wait, 0.0))
            if not done and time.monotonic() - sent - wait > HELD:
                self.counters["lease_answers_awaited_late"] += 1
                await asyncio.wait({refresh}, timeout=self.margin / 2)
            if not refresh.done():
                raise TimeoutError(f"no answer in {time.monotonic() - sent:.2f}s")
            return refresh.result()
        finally:
            refresh.cancel()  # nothing when it is done

    async def _depose_all(self, why: str) -> None:
        for shard in sorted(self.leading):
            await self._end(shard, why)

    async def _end(self, shard: int, why: str) -> None:
        if self.leading.pop(shard, None) is not None:
            self.counters["depositions"] += 1
            log.warning("shard %d: no longer its leader: %s", shard, why)
            await self._depose(shard, why)

    async def _campaign(self) -> None:
        while not self.closing:
            changed = self.state.coordination_changed
            changed.clear()
            try:
                await self._campaign_once()
            except Exception as e:
                log.warning("campaign pass failed: %s: %s", type(e).__name__, e)
            try:
                await asyncio.wait_for(changed.wait(), 0.25)
            except TimeoutError:
                pass

    def _fair_share(self) -> int:
        schedulers = sum(1 for m in self.state.members.values() if "scheduler" in m.get("roles", ()))
        return math.ceil(len(self.shards) / max(schedulers, 1))

    async def _campaign_once(self) -> None:
        now = time.monotonic()
        # leaderships that ended in etcd (the key expired or was taken) while we thought we led
        for shard, fence in list(self.leading.items()):
            cur = self.state.leaders.get(shard)
            if self.state.revision >= fence.epoch and (cur is None or cur.mod_revision != fence.epoch):
                await self._end(shard, "its leader key is gone")
        if not self.valid():
            return
        for shard in self.shards:
            if shard in self.leading:
                continue
            cur = self.state.leaders.get(shard)
            if cur is not None:
                self._leaderless_since.pop(shard, None)
                if cur.value.get("member") == self.id and cur.value.get("lease") == self.lease \
                        and self._handed.get(shard, (0, 0))[1] != cur.mod_revision:
                    # still ours in etcd (we stepped down while cut off, and the lease survived;
                    # not one this process handed over, whose deletion the view has yet to see)
                    await self._begin(Fence(shard, cur.mod_revision, self.keys.leader(shard)))
                continue
            since = self._leaderless_since.setdefault(shard, now)
            if now - self._handed.get(shard, (-math.inf, 0))[0] < self.handover_wait and now - since < 2 * self.fair_wait:
                continue  # handed over just now: the member it went to takes it
            if len(self.leading) >= self._fair_share() and now - since < self.fair_wait:
                continue
            got = await asyncio.wait_for(self.store.create(
                self.keys.leader(shard), {"member": self.id, "url": self.url, "lease": self.lease, "at": time.time()},
                self.lease), self.ttl)
            if got.value is not None and got.value.get("member") == self.id and got.value.get("lease") == self.lease:
                self._leaderless_since.pop(shard, None)
                await self._begin(Fence(shard, got.mod_revision, self.keys.leader(shard)))
        await self._hand_over()

    def _leads_by_member(self) -> dict[str, int]:
        """Shards led, by member with the scheduler role (each such member listed)."""
        loads = {mid: 0 for mid, m in self.state.members.items() if "scheduler" in m.get("roles", ())}
        for cur in self.state.leaders.values():
            mid = cur.value.get("member") if isinstance(cur.value, dict) else None
            if mid in loads:
                loads[mid] += 1
        return loads

    async def _hand_over(self) -> None:
        """Give one shard back for a member that leads at least two fewer and may lead it, so that
        a member that joins later takes its part (shards spread only when leaderless before). One
        shard a `handover_wait`: the leadership ends here (scheduler and TaskControl sessions
        stopped), then its key is deleted and the other member, below its fair share, campaigns at
        once. Nothing else stops: the new leader's scheduler takes the jobs as they are, and the
        old one's fence makes any write still in flight fail."""
        now = time.monotonic()
        if len(self.leading) < 2 or now - self._last_handover < self.handover_wait or not self.valid():
            return
        loads = self._leads_by_member()
        mine = len(self.leading)
        takers = sorted((n, mid) for mid, n in loads.items()
                        if mid != self.id and n + 2 <= mine)
        for n, mid in takers:
            may = set(self.state.members.get(mid, {}).get("shards", ()))
            shard = max((s for s in self.leading if s in may), default=None)
            if shard is None:
                continue
            fence = self.leading[shard]
            self._last_handover = now
            self._handed[shard] = (now, fence.epoch)
            self.counters["handovers"] += 1
            await self._end(shard, f"handed over for member {mid}, which leads {n} shard(s) to this one's {mine}")
            try:
                await asyncio.wait_for(self.store.delete_if(fence.key, fence.epoch), self.ttl)
            except Exception as e:
                # the key stays ours (our lease lives on, so it never expires): we lead it again,
                # or nobody would
                self._handed.pop(shard, None)
                log.warning("shard %d: handing it over failed: %s: %s", shard, type(e).__name__, e)
            return

    async def _begin(self, fence: Fence) -> None:
        self.leading[fence.shard] = fence
        self.counters["elections_won"] += 1
        log.warning("shard %d: this process (%s) leads it, epoch %d", fence.shard, self.id, fence.epoch)
        try:
            await self._lead(fence)
        except Exception as e:  # could not start acting (our view lags etcd): give the shard back
            log.warning("shard %d: giving the leadership back: %s: %s", fence.shard, type(e).__name__, e)
            await self._end(fence.shard, "it could not start")
            try:
                await asyncio.wait_for(self.store.delete_if(fence.key, fence.epoch), self.ttl)
            except Exception:
                pass  # the lease ends it

    async def resign(self) -> None:
        """At a clean stop: end every leadership and the membership at once (revoking the lease
        deletes its keys), so followers take over without waiting for the TTL."""
        self.closing = True
        await self._depose_all("stopping")
        if self.lease is not None:
            try:
                await asyncio.wait_for(self.store.revoke(self.lease), 2.0)
            except Exception as e:
                log.warning("revoking the lease failed (it expires in %ds): %s", self.ttl, e)
            self.lease = None

