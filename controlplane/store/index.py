"""An in-memory cache of a key prefix: a range read, then a watch from the revision after it.

When the watch ends or fails (etcd down or restarted, another endpoint taken, a revision
compacted), the index reads the prefix afresh, with a backoff capped at 1 s, until etcd answers;
it hands its owner every key that differs from the cache, and watches again from there. Meanwhile
the cache answers reads as it was (`stale` says why it may be behind). A restarted daemon rebuilds
it the same way; nothing is lost when a process dies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from controlplane.store.etcd import Change, Store, Versioned

log = logging.getLogger("twine.store.index")

RESYNC_FIRST, RESYNC_MAX = 0.05, 1.0  # seconds between range reads while etcd does not answer


class Index:
    """`items`: every key's value and mod revision, kept unless `keep_values` is False. An owner
    that keeps its own decoded records (RegionState) has the index keep only each key's mod
    revision (`revisions`): a second copy of the region's values, each several objects, was most
    of what the garbage collector's full passes scanned."""

    def __init__(self, store: Store, prefix: str, on_change: Callable[[Change], None] | None = None,
                 keep_values: bool = True, raw: bool = False, revisions: dict[str, int] | None = None,
                 unkept: tuple[str, ...] = ()):
        self.store = store
        # keys under these prefixes the owner keeps nothing of, not even their revisions: a fresh
        # read does not hand them on as changed (the watch hands on every change, for wait_for).
        # Meant for an owner that keeps the revisions itself (`revisions`) and none of these keys in them
        self.unkept = unkept
        # `revisions` given: the owner's own dict of each key's mod revision, which its on_change
        # keeps (RegionState.revs); the index reads it to find what a fresh read changed and keeps
        # no second copy (one entry per key of the region in each)
        self._own_revisions = revisions is None
        self.raw = raw  # values as etcd has them (Store.range's raw), for an owner that decodes them
        self.prefix = prefix
        self.keep_values = keep_values
        self.items: dict[str, Versioned] = {}
        self.revisions: dict[str, int] = {} if revisions is None else revisions
        self.revision = 0
        self.stale = ""  # "" while the watch follows etcd; else why the cache may be behind
        self.resyncs = 0
        self._start_revision = 0  # the last range read's: everything up to it is in `items`
        self._events: dict[int, int] = {}  # revision -> events seen at it (the latest few)
        self.on_change = on_change
        self._advanced = asyncio.Condition()
        self._task: asyncio.Task | None = None

    async def start(self, each: Callable[[Versioned], None] | None = None) -> list[Versioned]:
        """The first range read (raises if etcd does not answer), then the watch. Returns what
        the read found; with `each`, hands it each key as its page is read instead, and returns
        nothing (an owner that keeps its own decoded records need not hold all of etcd's values
        at once)."""
        found: list[Versioned] = []

        def page(items: list[Versioned]) -> None:
            for v in items:
                if self._own_revisions:
                    self.revisions[v.key] = v.mod_revision
                if self.keep_values:
                    self.items[v.key] = v
                if each is None:
                    found.append(v)
                else:
                    each(v)

        if self._own_revisions:
            self.revisions = {}
        self.items = {}
        _, revision = await self.store.range(self.prefix, raw=self.raw, each=page)
        self.revision = self._start_revision = revision
        self._task = asyncio.create_task(self._follow())
        return found

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _follow(self) -> None:
        delay = RESYNC_FIRST
        start = self._start_revision + 1
        while True:
            began = time.monotonic()
            why = await self._watch_until_moved(start)
            if why is None:  # the store moved to another member: the watch goes on there, read nothing again
                start = self.revision  # its events again (applied twice they change nothing): none is missed
                self._events.pop(start, None)  # counted afresh as they come again (wait_for counts them)
                log.warning("%s: watching from revision %d on %s", self.prefix, start, self.store.endpoint)
                continue
            start = self._start_revision + 1
            if time.monotonic() - began > RESYNC_MAX:
                delay = RESYNC_FIRST  # it followed for a while: a new outage starts quick
            self.stale = self.store.unavailable or why  # the cause, when etcd is it
            log.warning("%s; reading it afresh", why)
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESYNC_MAX)
                try:
                    items, revision = await self.store.range(self.prefix, raw=self.raw)
                    break
                except Exception as e:  # noqa: BLE001 - retried until etcd answers
                    self.stale = self.store.unavailable or f"reading {self.prefix} failed: {e}"
                    log.debug("%s", self.stale)
            await self._resync(items, revision)
            start = self._start_revision + 1

    async def _watch_until_moved(self, start: int) -> str | None:
        """_watch, ended when the store moves to another member (None then): a watch on a member
        cut off by a partition would go on waiting in silence until gRPC's keep-alive noticed."""
        moved = asyncio.ensure_future(self.store.moved().wait())
        watching = asyncio.ensure_future(self._watch(start))
        try:
            await asyncio.wait({moved, watching}, return_when=asyncio.FIRST_COMPLETED)
            if watching.done():
                return watching.result()
            watching.cancel()
            try:
                await watching
            except asyncio.CancelledError:
                if (me := asyncio.current_task()) is not None and me.cancelling():
                    raise  # the index itself is stopped
            return None
        finally:
            moved.cancel()
            watching.cancel()

    async def _watch(self, start: int) -> str:
        """Apply the watch's changes until it ends; returns why it ended. An exception from
        on_change is a bug, and propagates."""
        watch = self.store.watch(self.prefix, start, raw=self.raw)
        try:
            while True:
                try:
                    change = await anext(watch)
                except StopAsyncIteration:
                    return f"the watch on {self.prefix} ended"
                except Exception as e:  # noqa: BLE001 - etcd gone, compacted, or refusing: read afresh
                    return f"the watch on {self.prefix} failed: {e}"
                self._apply(change)
                async with self._advanced:
                    self._advanced.notify_all()
        finally:
            await watch.aclose()

    def _apply(self, change: Change) -> None:
        if change.value is None:
            if self._own_revisions:
                self.revisions.pop(change.key, None)
            self.items.pop(change.key, None)
        else:
            if self._own_revisions:
                self.revisions[change.key] = change.mod_revision
            if self.keep_values:
                self.items[change.key] = Versioned(change.key, change.value, change.mod_revision)
        self.revision = max(self.revision, change.mod_revision)
        self._events[change.mod_revision] = self._events.get(change.mod_revision, 0) + 1
        if len(self._events) > 256:
            for r in [r for r in self._events if r < self.revision - 128]:
                del self._events[r]
        if self.on_change:
            self.on_change(change)

    async def _resync(self, items: list[Versioned], revision: int) -> None:
        """Take a fresh range read: hand on_change every key that differs from the cache (a
        deleted one as None, at the read's revision), in key order as at start."""
        unkept = self.unkept
        fresh = {v.key: v for v in items if not (unkept and v.key.startswith(unkept))}
        # a key's mod revision names its value: the same revision, the same value
        changes = [Change(k, None, revision) for k in self.revisions if k not in fresh]
        changes += [Change(k, v.value, v.mod_revision) for k, v in fresh.items()
                    if self.revisions.get(k) != v.mod_revision]
        if self._own_revisions:  # else the owner's on_change brings its own up to date, below
            self.revisions = {k: v.mod_revision for k, v in fresh.items()}
        if self.keep_values:
            self.items = fresh
        self.revision = self._start_revision = revision  # every change up to it is in the cache
        self._events.clear()
        self.stale = ""
        self.resyncs += 1
        log.warning("%s read afresh at revision %d: %d keys changed meanwhile", self.prefix, revision, len(changes))
        if self.on_change:
            for change in sorted(changes, key=lambda c: c.key):
                self.on_change(change)
        async with self._advanced:
            self._advanced.notify_all()

    async def watching(self) -> None:
        """Until the follow loop fails, which only a bug does (an etcd outage is waited out); then
        raise, and the owner exits."""
        assert self._task is not None
        await asyncio.shield(self._task)
        raise RuntimeError(f"the index of {self.prefix} stopped following etcd")

    async def wait_for(self, revision: int, timeout: float = 10) -> None:
        """Until the cache has seen every change up to revision (read-your-writes). For a
        Revision from a commit, that is all of its events, not the first of them."""
        events = getattr(revision, "events", None)

        def seen() -> bool:
            if self.revision != revision or events is None or revision <= self._start_revision:
                return self.revision >= revision
            return self._events.get(revision, 0) >= events

        async with self._advanced:
            await asyncio.wait_for(self._advanced.wait_for(seen), timeout)
