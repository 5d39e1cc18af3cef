"""An in-memory cache of a key prefix: a range read, then a watch from the revision after it.

A restarted daemon rebuilds it the same way; nothing is lost when a process dies.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from controlplane.store.etcd import Change, Store, Versioned

log = logging.getLogger("twine.store.index")


class Index:
    def __init__(self, store: Store, prefix: str, on_change: Callable[[Change], None] | None = None):
        self.store = store
        self.prefix = prefix
        self.items: dict[str, Versioned] = {}
        self.revision = 0
        self._start_revision = 0  # the range read's: everything up to it is in `items`
        self._events: dict[int, int] = {}  # revision -> events seen at it (the latest few)
        self.on_change = on_change
        self._advanced = asyncio.Condition()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        items, revision = await self.store.range(self.prefix)
        self.items = {v.key: v for v in items}
        self.revision = self._start_revision = revision
        self._task = asyncio.create_task(self._follow(revision + 1))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _follow(self, start: int) -> None:
        async for change in self.store.watch(self.prefix, start):
            if change.value is None:
                self.items.pop(change.key, None)
            else:
                self.items[change.key] = Versioned(change.key, change.value, change.mod_revision)
            self.revision = max(self.revision, change.mod_revision)
            self._events[change.mod_revision] = self._events.get(change.mod_revision, 0) + 1
            if len(self._events) > 256:
                for r in [r for r in self._events if r < self.revision - 128]:
                    del self._events[r]
            if self.on_change:
                self.on_change(change)
            async with self._advanced:
                self._advanced.notify_all()

    async def watching(self) -> None:
        """Until the watch ends; then raise: the cache is no longer current (etcd went away, or
        compacted past us). The owner exits, and its restart rebuilds the cache."""
        assert self._task is not None
        await asyncio.shield(self._task)
        raise ConnectionError(f"the watch on {self.prefix} ended")

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
