"""etcd access: versioned reads, guarded transactions, optimistic update loops, watches."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import aetcd
import msgspec


def encode(value: Any) -> bytes:
    """Compact JSON with sorted keys, by msgspec (several times faster than json.dumps on the
    records every commit writes). Same JSON as json.dumps(sort_keys=True, separators=(",", ":"))
    but for spelling: UTF-8 rather than \\u escapes, 1e16 rather than 1e+16; NaN and infinities,
    which JSON has no words for and no record holds, become null. Dicts with keys other than
    strings go through json, which writes the keys as strings."""
    try:
        return msgspec.json.encode(value, order="sorted")
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:  # NaN or Infinity, which json.dumps wrote
        return json.loads(raw)


@dataclass(frozen=True)
class Versioned:
    """A value as read, with the mod revision that a later write must compare against.
    mod_revision 0 means the key did not exist."""

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


class TooLarge(Exception):
    """etcd refused a transaction for its size (operations or bytes): a deployment limit, not a
    conflict. Retrying does not help; etcd needs larger limits (docs/api.md, "etcd")."""


# etcd's defaults (128 operations, 1.5 MiB a request) fit a job of about 60 tasks in the one
# transaction that creates it; the daemon's etcd runs with these instead (a 10,000-task job).
ETCD_FLAGS = ("--max-txn-ops", "65536", "--max-request-bytes", str(32 * 1024 * 1024))


@dataclass(frozen=True)
class Change:
    key: str
    value: Any | None  # None: deleted
    mod_revision: int


Plan = tuple[dict[str, Any], list[str]]  # (puts, deletes)


class Store:
    def __init__(self, host: str = "127.0.0.1", port: int = 2379, timeout: float = 10):
        self.client = aetcd.Client(host=host, port=port, timeout=timeout)

    async def close(self) -> None:
        await self.client.close()

    async def read(self, key: str) -> Versioned:
        got = await self.client.get(key.encode())
        if got is None:
            return Versioned(key, None, 0)
        return Versioned(key, decode(got.value), got.mod_revision)

    async def range(self, prefix: str) -> tuple[list[Versioned], int]:
        """Every key under prefix, and the store revision the read saw (for a watch to follow)."""
        got = await self.client.get_prefix(prefix.encode())
        items = [Versioned(kv.key.decode(), decode(kv.value), kv.mod_revision) for kv in got]
        return items, got.header.revision

    async def commit(self, reads: list[Versioned], puts: dict[str, Any], deletes: tuple[str, ...] | list[str] = ()) -> int:
        """One transaction: apply puts and deletes only if every read is still current.
        Returns the new revision; raises Conflict otherwise."""
        t = self.client.transactions
        compare = [t.mod(r.key.encode()) == r.mod_revision for r in reads]
        ops = [t.put(k.encode(), encode(v)) for k, v in puts.items()]
        ops += [t.delete(k.encode()) for k in deletes]
        try:
            ok, responses = await self.client.transaction(compare=compare, success=ops, failure=[])
        except aetcd.exceptions.InvalidArgumentError as e:
            if "too many operations" in str(e) or "too large" in str(e):
                raise TooLarge(f"etcd refused a transaction of {len(compare)} compares and {len(ops)} operations "
                               f"({e}); run etcd with {' '.join(ETCD_FLAGS)}") from None
            raise
        if not ok:
            raise Conflict(", ".join(r.key for r in reads))
        events = 0
        for r in responses:
            kind = r.WhichOneof("response")
            events += 1 if kind == "response_put" else getattr(r, kind).deleted if kind == "response_delete_range" else 0
        return Revision(max((getattr(r, r.WhichOneof("response")).header.revision for r in responses), default=0), events)

    async def update(
        self, keys: list[str], compute: Callable[[dict[str, Versioned]], Plan | Awaitable[Plan]], retries: int = 20
    ) -> int:
        """Optimistic concurrency: read keys, compute (puts, deletes) from them, commit guarded by
        their revisions; on conflict re-read and recompute. compute may raise to abort."""
        for attempt in range(retries):
            reads = {k: await self.read(k) for k in keys}
            plan = compute(reads)
            if asyncio.iscoroutine(plan):
                plan = await plan
            puts, deletes = plan
            try:
                return await self.commit(list(reads.values()), puts, deletes)
            except Conflict:
                await asyncio.sleep(min(0.001 * 2**attempt, 0.1))
        raise Conflict(f"gave up after {retries} conflicts on {', '.join(keys)}")

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:
        """Changes under prefix from start_revision on, in order."""
        watch = await self.client.watch_prefix(prefix.encode(), start_revision=start_revision)
        async for event in watch:
            kv = event.kv
            value = None if event.kind == "DELETE" else decode(kv.value)
            yield Change(kv.key.decode(), value, kv.mod_revision)
