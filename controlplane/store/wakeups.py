"""Wake-ups fed by the watch: each scheduler shard's queue of the jobs a change may concern, so
that a pass costs the jobs that changed, not the region (DESIGN.md: cost follows the change)."""

from __future__ import annotations

import asyncio
from typing import Iterable


class WorkQueue:
    """One subscriber's queue of jobs to look at again, and the event that says it is not empty."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.jobs: set[str] = set()
        self.everything = True  # a new subscriber looks at every job first

    def take(self) -> tuple[set[str], bool]:
        jobs, everything = self.jobs, self.everything
        self.jobs, self.everything = set(), False
        self.event.clear()
        return jobs, everything


class Wakeups:
    """Work queues of changed jobs, fed by the watch (each shard's scheduler has its own).
    `set(jobs)` queues those jobs; `set()` with none queues every job (a change whose reach is
    not worth computing: a maintenance scheduled, a leadership begun)."""

    def __init__(self) -> None:
        self._queues: list[WorkQueue] = []

    def subscribe(self) -> WorkQueue:
        q = WorkQueue()
        q.event.set()
        self._queues.append(q)
        return q

    def unsubscribe(self, q: WorkQueue) -> None:
        if q in self._queues:
            self._queues.remove(q)

    def set(self, jobs: Iterable[str] | None = None) -> None:
        if not self._queues:
            return
        if jobs is None:
            for q in self._queues:
                q.everything = True
                q.event.set()
            return
        jobs = set(jobs)
        if not jobs:
            return
        for q in self._queues:
            q.jobs |= jobs
            q.event.set()
