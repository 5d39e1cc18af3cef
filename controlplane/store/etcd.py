"""etcd access: versioned reads, guarded transactions, optimistic update loops, watches.

The store takes a list of etcd endpoints (the members of one cluster) and talks to one at a time.
When a call cannot reach it, the store moves to the next and tries the call there, one round, then
raises `Unavailable` naming each endpoint and its error. A transaction that timed out is not tried
again (it may have landed). `Store.unavailable` says the same until etcd answers again: the store
looks once a second meanwhile, so it does not outlast the outage. The API's 503s and /healthz
read it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import NamedTuple, Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import aetcd
from aetcd.exceptions import ConnectionFailedError, ConnectionTimeoutError, WatchTimeoutError

from controlplane.store.codec import decode, decode_value, encode, sized
from controlplane.store.etcdtls import EtcdTls, TlsClient

log = logging.getLogger("twine.store")
T = TypeVar("T")

# grpc's reconnect backoff grows to 120 s by default: after a 30 s outage the channel would wait
# up to about 17 s more before it looked again. Capped at 1 s, a returning etcd is seen at once.
# Keepalive pings find a peer gone silently (no RST: a partition, a hung host) in about 15 s;
# etcd accepts a ping every 5 s or more.
# (Not grpc.min_reconnect_backoff_ms: gRPC also takes it as the least time a connection attempt
# is given, 20 s by default; at 100 ms a slow host, such as an emulated VM, never finished the
# HTTP/2 handshake with its own etcd.)
CHANNEL_OPTIONS = {
    # gRPC's default (4 MiB) is below what one etcd answer may carry: a watch response with a
    # large transaction's events, or a range page of large values (issue #11: a daemon that died
    # on its watch and could not restart). Our etcds take requests up to 32 MiB (ETCD_FLAGS).
    "grpc.max_receive_message_length": 64 * 1024 * 1024, "grpc.max_send_message_length": 64 * 1024 * 1024,
    "grpc.initial_reconnect_backoff_ms": 100, "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000, "grpc.keepalive_timeout_ms": 5_000, "grpc.http2.max_pings_without_data": 0,
}
# What "etcd cannot be reached" looks like through aetcd: grpc UNAVAILABLE (refused, reset, no
# leader), DEADLINE_EXCEEDED (no answer in time), a watch whose creation was not answered.
UNREACHABLE = (ConnectionFailedError, ConnectionTimeoutError, WatchTimeoutError)
PROBE_INTERVAL = 1.0  # seconds between looks while unreachable
WRITE_TIMEOUT = 3.0  # seconds a transaction may take (Store.write_timeout)
PICK_TIMEOUT = 1.0  # seconds the other members are given to answer, when the store moves
RANGE_PAGE = 5000  # keys per range read
PROBE_KEY = b"/twine-probe"
CHECK_TIMEOUT = 2.0  # seconds a member is given to answer `Store.check` (kube-apiserver's etcd check: 2 s too)


@aetcd.client._handle_errors
async def _range_page(c: aetcd.Client, start: bytes, end: bytes, limit: int, revision: int):
    """A Range request with the limit and revision aetcd's get_range does not pass on."""
    await c.connect()
    req = aetcd.rpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision)
    return await c.kvstub.Range(req, timeout=c._timeout, metadata=c.metadata)


@aetcd.client._handle_errors
async def _txn(c: aetcd.Client, request: aetcd.rpc.TxnRequest, timeout: float):
    """A Txn request built here from etcd's messages: aetcd's transaction() builds each operation
    through several layers of helpers, a cost that showed per job in the scheduler's commits."""
    await c.connect()
    return await c.kvstub.Txn(request, timeout=timeout, metadata=c.metadata)


@aetcd.client._handle_errors
async def _probe(c: aetcd.Client, timeout: float):
    """A linearizable read of one key (answered only by a member that has a leader)."""
    await c.connect()
    req = aetcd.rpc.RangeRequest(key=PROBE_KEY, limit=1)
    return await c.kvstub.Range(req, timeout=timeout, metadata=c.metadata)


async def _status(c: aetcd.Client, timeout: float) -> int:
    """The member's leader's id (0: it knows none), asked of its maintenance service."""
    await c.connect()
    answer = await c.maintenancestub.Status(aetcd.rpc.StatusRequest(), timeout=timeout, metadata=c.metadata)
    return answer.leader


def txn_request(reads: list[Versioned], puts: dict[str, Any], deletes) -> aetcd.rpc.TxnRequest:
    """deletes: keys, or (start, end) pairs: every key from start up to end (not included).
    Each operation is filled in where it lies in the request (add()), not made as a message of its
    own and copied in: a 36-task job's commit is about a hundred of them (2.4x faster, timeit)."""
    rpc = aetcd.rpc
    req = rpc.TxnRequest()
    equal, mod, compare = rpc.Compare.EQUAL, rpc.Compare.MOD, req.compare.add
    for r in reads:
        compare(result=equal, target=mod, key=r.key.encode(), mod_revision=r.mod_revision)
    op = req.success.add
    for k, v in puts.items():
        put = op().request_put
        put.key, put.value = k.encode(), encode(v)
    for k in deletes:
        delete = op().request_delete_range
        if isinstance(k, str):
            delete.key = k.encode()
        else:
            delete.key, delete.range_end = k[0].encode(), k[1].encode()
    return req


class Versioned(NamedTuple):
    """A value as read, with the mod revision that a later write must compare against.
    mod_revision 0 means the key did not exist. (A named tuple: every commit makes one a record
    it guards, and a frozen dataclass cost several times as much to make.)"""

    key: str
    value: Any
    mod_revision: int


class Revision(int):
    """A committed transaction's revision, with how many watch events it makes (its puts, and its
    deletes that found a key). etcd may deliver one transaction's events in several watch
    responses: a cache has seen the whole commit only when it has seen that many events at this
    revision, or any later one. (So a commit waited on writes only keys the cache watches: all of
    the daemon's keys are under /twine/<region>/.)"""

    events: int | None

    def __new__(cls, value: int, events: int | None = None) -> Revision:
        r = super().__new__(cls, value)
        r.events = events
        return r


class Conflict(Exception):
    """A guarded transaction lost: something it read changed. Re-read, recompute, retry."""


class Unavailable(ConnectionError):
    """No endpoint of etcd could be reached (str: which, and why). Nothing was written, except
    after a timeout of a transaction, whose outcome is unknown: a guarded retry is safe either
    way (it conflicts if the first one landed)."""


class TooLarge(Exception):
    """etcd refused a transaction for its size (operations or bytes): a deployment limit, not a
    conflict. Retrying does not help; etcd needs larger limits (docs/api.md, "etcd")."""


# etcd's defaults (128 operations, 1.5 MiB a request) serve any job: the scheduler commits in
# batches of --max-txn-ops. Our etcds run with these larger limits all the same (fewer batches).
# Their history is bounded: usage and SRM records are rewritten every hour, so without compaction
# etcd keeps every version until its backend quota fills; an hour's history is kept (a watcher
# that falls further behind reads afresh, as after any compaction).
ETCD_COMPACTION = ("--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1h")
ETCD_FLAGS = ("--max-txn-ops", "65536", "--max-request-bytes", str(32 * 1024 * 1024), *ETCD_COMPACTION)


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    value: Any | None  # None: deleted
    mod_revision: int


Plan = tuple[dict[str, Any], list[str]]  # (puts, deletes)


Endpoint = tuple[str, int]


class Store:
    def __init__(self, endpoints: Sequence[Endpoint] = (("127.0.0.1", 2379),), timeout: float = 10,
                 write_timeout: float = WRITE_TIMEOUT,
                 tls: EtcdTls | None = None):
        if not endpoints:
            raise ValueError("etcd: no endpoint")
        self.endpoints = [(str(h), int(p)) for h, p in endpoints]
        self.timeout = timeout
        # a transaction unanswered this long is given up (and the next member used): one a member
        # proposed to a leader that died waits out etcd's own request timeout (5 s + two election
        # timeouts: 7 s by default) before etcd says so
        self.write_timeout = min(write_timeout, timeout)
        self.tls = tls
        self.unavailable = ""  # "" while etcd answers; else which endpoints failed and how
        self._at = 0  # the endpoint in use
        self.client = self._client()
        self._retiring: set[asyncio.Task] = set()
        self._probe: asyncio.Task | None = None
        self._moved = asyncio.Event()  # set (and replaced) when the store moves to another member
        self._moving = asyncio.Lock()  # one move at a time: calls failing together move once

    def _client(self, at: int | None = None) -> aetcd.Client:
        host, port = self.endpoints[self._at if at is None else at]
        if self.tls is not None:
            return TlsClient(host=host, port=port, timeout=self.timeout, options=CHANNEL_OPTIONS, tls=self.tls)
        return aetcd.Client(host=host, port=port, timeout=self.timeout, options=CHANNEL_OPTIONS)

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self._at]
        return f"{host}:{port}"

    async def close(self) -> None:
        for task in [*self._retiring, *([self._probe] if self._probe else [])]:
            task.cancel()
        await asyncio.gather(*self._retiring, *([self._probe] if self._probe else []), return_exceptions=True)
        await self.client.close()

    async def _failed(self, client: aetcd.Client, at: str, e: Exception) -> str:
        """A call on `client` could not reach its endpoint `at`: move on to another endpoint
        (unless another call has moved already). Returns the failure, for the message."""
        why = f"{at}: {e}"
        if len(self.endpoints) == 1:
            return why
        async with self._moving:
            if client is not self.client:
                return why  # another call moved already
            self._at, self.client = await self._pick()
            log.warning("etcd at %s: moving to %s", why, self.endpoint)
            self._moved.set()
            self._moved = asyncio.Event()
            task = asyncio.get_running_loop().create_task(self._retire(client))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return why

    async def _pick(self) -> tuple[int, aetcd.Client]:
        """The member to move to: of the others, asked at once for their status, the first in turn
        that answers within PICK_TIMEOUT and knows a leader, else the first that answers at all,
        else the next in turn. (Taking the next in turn blindly, a store leaving a member that lost
        its leader could land on that leader, cut off by a partition: its connection then hangs
        until gRPC gives up, 5 s and more.)"""
        n = len(self.endpoints)
        order = [(self._at + k) % n for k in range(1, n)]
        clients = {i: self._client(i) for i in order}
        asks = {i: asyncio.ensure_future(_status(c, PICK_TIMEOUT)) for i, c in clients.items()}
        pick = order[0]
        try:
            await asyncio.wait(asks.values(), timeout=PICK_TIMEOUT)
            answered = {i: t.result() for i, t in asks.items() if t.done() and not t.exception()}
            with_leader = [i for i in order if answered.get(i)]
            pick = (with_leader or [i for i in order if i in answered] or order)[0]
        finally:  # cancelled meanwhile too: no client is left open but the one returned
            for t in asks.values():
                t.cancel()
            await asyncio.gather(*asks.values(), return_exceptions=True)  # a member that did not answer is no news
            for i, c in clients.items():
                if i != pick or asyncio.current_task().cancelling():
                    await c.close()
        return pick, clients[pick]

    def moved(self) -> asyncio.Event:
        """Set when the store moves to another member (an event each time: take it anew)."""
        return self._moved

    async def suspect(self, why: str) -> None:
        """A caller's word that the member in use does not answer (a lease keep-alive unanswered,
        say): the store moves to another member, as after a call of its own that timed out."""
        await self._failed(self.client, self.endpoint, TimeoutError(why))

    async def _retire(self, client: aetcd.Client) -> None:
        """Close a client the store moved away from, once the calls in flight on it have had their
        time (closing cancels them: such a call is tried again on the member in use, `_call`). The
        index's watch does not wait for this: it ends at the move (store/index.py)."""
        try:
            await asyncio.sleep(self.timeout)
        finally:
            await client.close()

    def _reached(self) -> None:
        if self.unavailable:
            log.warning("etcd at %s answers again", self.endpoint)
            self.unavailable = ""

    def _unreachable(self, why: str) -> Unavailable:
        self.unavailable = why
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_reached())
        return Unavailable(why)

    async def _probe_until_reached(self) -> None:
        """`unavailable` must not outlast the outage when nobody calls: look once a second."""
        while self.unavailable:
            await asyncio.sleep(PROBE_INTERVAL)
            try:
                await self._call(lambda c: c.get(PROBE_KEY))  # a linearizable read: a member with a leader
            except Exception:  # noqa: BLE001 - `unavailable` says why
                pass

    async def check(self) -> str:
        """For /healthz: "" when the member in use answers a linearizable read now (a member with a
        leader), else why not; the last call's word is not enough (a daemon whose etcd died a moment
        ago has not necessarily read the closed socket yet). A member that does not answer within
        CHECK_TIMEOUT is reported and nothing more: the daemon's own calls allow `timeout`, and a
        probe must not move the store or mark the view stale (pausing the scheduler) on a slow
        fsync. A member that refuses the connection is met as any call meets it: the store moves
        on to the others (one round) and says so in `unavailable` if none answers."""
        if self.unavailable:
            return self.unavailable
        client, at = self.client, self.endpoint
        try:
            await _probe(client, CHECK_TIMEOUT)
            return ""
        except ConnectionTimeoutError:
            return f"etcd unreachable at {at}: no answer in {CHECK_TIMEOUT:g} s"
        except UNREACHABLE:
            try:
                await self._call(lambda c: _probe(c, CHECK_TIMEOUT), retry_timeouts=False)
                return ""
            except Unavailable as e:
                return str(e)
            except Exception as e:  # noqa: BLE001 - whatever it is, the answer is 503 saying it
                return f"etcd at {self.endpoint}: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - an error etcd answered with (a permission, say), or a surprise
            return f"etcd at {at}: {type(e).__name__}: {e}"

    async def _call(self, op: Callable[[aetcd.Client], Awaitable[T]], retry_timeouts: bool = True) -> T:
        """op on the endpoint in use; on a connection failure, on the next ones, one round."""
        failures = []
        for _ in range(len(self.endpoints)):
            client, at = self.client, self.endpoint
            try:
                result = await op(client)
            except asyncio.CancelledError:
                if client is self.client or ((me := asyncio.current_task()) is not None and me.cancelling()):
                    raise
                failures.append(f"{at}: closed under the call")  # the store moved on and retired it
                continue
            except Exception as e:
                # A cancel that reaches the call can come back as the call's own error (grpc's
                # CANCELLED), which a caller would take for etcd's answer and retry: a loop
                # cancelled then never ends (issue #12, a deposed scheduler). It is a cancel.
                if (me := asyncio.current_task()) is not None and me.cancelling():
                    raise asyncio.CancelledError(f"cancelled during an etcd call ({type(e).__name__}: {e})") from e
                if isinstance(e, UNREACHABLE):
                    failures.append(await self._failed(client, at, e))
                    if isinstance(e, ConnectionTimeoutError) and not retry_timeouts:
                        break  # it may have been applied: the caller decides
                    continue
                if isinstance(e, aetcd.exceptions.ClientError) and client is not self.client:
                    failures.append(f"{at}: closed under the call")  # another call moved on: try again
                    continue
                raise
            self._reached()
            return result
        raise self._unreachable("etcd unreachable at " + "; at ".join(failures))

    async def read(self, key: str) -> Versioned:
        got = await self._call(lambda c: c.get(key.encode()))
        if got is None:
            return Versioned(key, None, 0)
        return Versioned(key, decode_value(got.value), got.mod_revision)

    async def range(self, prefix: str, page: int = RANGE_PAGE, raw: bool = False,
                    each: Callable[[list[Versioned]], None] | None = None) -> tuple[list[Versioned], int]:
        """Every key under prefix, and the store revision the read saw (for a watch to follow).
        Read in pages of `page` keys, all at the first page's revision: one answer for a large
        region would pass gRPC's message limit (10,000 machine records are about 6 MB). `raw`:
        values as etcd has them (bytes, or Skipped when too large), for an owner that decodes
        each kind of record straight into its type (RegionState). `each`: handed every page as it
        is read, and the list returned is empty (a million records' values are never all held
        at once)."""
        value_of = sized if raw else decode_value
        start, end = prefix.encode(), aetcd.utils.prefix_range_end(prefix.encode())
        items: list[Versioned] = []
        revision = 0
        while True:
            try:
                got = await self._call(lambda c: _range_page(c, start, end, page, revision))
            except aetcd.exceptions.ClientError as e:
                if "larger than max" not in str(e) or page == 1:
                    raise
                page = max(1, page // 8)  # a page of large values: fewer keys an answer
                log.warning("reading %s: %s; %d keys a page from here", prefix, e, page)
                continue
            revision = revision or got.header.revision
            got_page = [Versioned(kv.key.decode(), value_of(kv.value), kv.mod_revision) for kv in got.kvs]
            if each is None:
                items += got_page
            else:
                each(got_page)
            if not got.more or not got.kvs:
                return items, revision
            start = got.kvs[-1].key + b"\0"

    async def commit(self, reads: list[Versioned], puts: dict[str, Any],
                     deletes: Sequence[str | tuple[str, str]] = ()) -> int:
        """One transaction: apply puts and deletes (keys, or (start, end) ranges) only if every read
        is still current. Returns the new revision; raises Conflict otherwise."""
        request = txn_request(reads, puts, deletes)
        try:
            got = await self._call(lambda c: _txn(c, request, self.write_timeout), retry_timeouts=False)
        except aetcd.exceptions.ClientError as e:
            # etcd's words: "too many operations in txn request", "request is too large"; its gRPC
            # server's: "received message larger than max" (RESOURCE_EXHAUSTED)
            if any(w in str(e) for w in ("too many operations", "too large", "larger than max")):
                raise TooLarge(f"etcd refused a transaction of {len(request.compare)} compares and "
                               f"{len(request.success)} operations ({e}); run etcd with {' '.join(ETCD_FLAGS)}") from None
            raise
        if not got.succeeded:
            raise Conflict(", ".join(r.key for r in reads))
        # the responses follow the operations: the puts', then the deletes' (each says how many it found)
        events = len(puts) + sum(r.response_delete_range.deleted for r in got.responses[len(puts):])
        return Revision(got.header.revision, events)

    async def update(
        self, keys: list[str], compute: Callable[[dict[str, Versioned]], Plan | Awaitable[Plan]], retries: int = 20
    ) -> int:
        """Optimistic concurrency: read keys, compute (puts, deletes) from them, commit guarded by
        their revisions; on conflict re-read and recompute. compute may raise to abort. Returns the
        commit's revision, or 0 when compute plans nothing (nothing is committed)."""
        for attempt in range(retries):
            # side by side: a machine failure pass reads an MSB's machines (issue #12)
            reads = dict(zip(keys, await asyncio.gather(*(self.read(k) for k in keys))))
            plan = compute(reads)
            if asyncio.iscoroutine(plan):
                plan = await plan
            puts, deletes = plan
            if not puts and not deletes:
                return 0
            try:
                return await self.commit(list(reads.values()), puts, deletes)
            except Conflict:
                await asyncio.sleep(min(0.001 * 2**attempt, 0.1))
        raise Conflict(f"gave up after {retries} conflicts on {', '.join(keys)}")

    async def watch(self, prefix: str, start_revision: int, raw: bool = False) -> AsyncIterator[Change]:
        """Changes under prefix from start_revision on, in order. Ends when the store moves to
        another endpoint; raises Unavailable when etcd goes away, RevisionCompactedError when
        start_revision is compacted: either way the watcher reads afresh (Index). `raw`: values
        undecoded, as range()'s."""
        value_of = sized if raw else decode_value
        client, at = self.client, self.endpoint
        try:
            watch = await self._call(lambda c: c.watch_prefix(prefix.encode(), start_revision=start_revision))
        except aetcd.exceptions.InternalError as e:  # its creation met the stream's end (below)
            raise self._unreachable(f"etcd unreachable at {await self._failed(client, at, e)}") from None
        client, at = self.client, self.endpoint
        try:
            async for event in watch:
                kv = event.kv
                value = None if event.kind == "DELETE" else value_of(kv.value)
                yield Change(kv.key.decode(), value, kv.mod_revision)
        except (*UNREACHABLE, aetcd.exceptions.InternalError) as e:
            # a stream cut by a dying peer may end as gRPC INTERNAL ("Internal error from Core")
            # rather than UNAVAILABLE: for a watch, it is the same loss of etcd (seen under load)
            raise self._unreachable(f"etcd unreachable at {await self._failed(client, at, e)}") from None
        finally:
            if client is self.client:
                try:
                    await watch.cancel()
                except (aetcd.exceptions.ClientError, AttributeError):  # AttributeError: the client is closed
                    pass

    # -- leases: members and shard leaders (controlplane/coordination/coordinator.py) --------------------

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id. Keys put with it go when it expires."""
        lease = await self._call(lambda c: c.lease(ttl))
        return lease.id

    async def refresh(self, lease_id: int) -> int:
        """Keep a lease alive; its TTL left in seconds (<= 0: it has expired, its keys are gone)."""
        reply = await self._call(lambda c: c.refresh_lease(lease_id))
        return int(reply.TTL) if reply is not None else 0

    async def revoke(self, lease_id: int) -> None:
        await self._call(lambda c: c.revoke_lease(lease_id))

    async def put_leased(self, key: str, value: Any, lease_id: int) -> int:
        got = await self._call(lambda c: c.put(key.encode(), encode(value), lease=lease_id))
        return got.header.revision

    async def create(self, key: str, value: Any, lease_id: int) -> Versioned:
        """Put `key`, attached to the lease, only if it does not exist. Returns it as written
        (the mod revision of the put) or, when another holds it, as it is (value and revision)."""
        t = self.client.transactions
        # retried after a timeout too: if the put landed, the retry finds our own value
        ok, responses = await self._call(lambda c: c.transaction(
            compare=[t.create(key.encode()) == 0], success=[t.put(key.encode(), encode(value), lease=lease_id)],
            failure=[t.get(key.encode())]))
        if ok:
            return Versioned(key, value, responses[0].response_put.header.revision)
        found = responses[0]  # [(value, Get)] of the failure branch's range
        if not found:
            return Versioned(key, None, 0)
        value, kv = found[0]
        return Versioned(key, decode(value), kv.mod_revision)

    async def delete_if(self, key: str, mod_revision: int) -> bool:
        """Delete `key` only if it is still at `mod_revision` (resigning a leadership)."""
        t = self.client.transactions
        ok, _ = await self._call(lambda c: c.transaction(compare=[t.mod(key.encode()) == mod_revision],
                                                         success=[t.delete(key.encode())], failure=[]))
        return bool(ok)
