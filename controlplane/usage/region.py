"""The region's current usage as one replica knows it: its own book (the machines whose heartbeats
reach it) plus the partial sums the other replicas relay every second (broker/relay.py). A partial
is sums per job and per fleet cell, never per machine: its size follows the jobs and the cells,
not the machines. A partial not renewed within `stale` seconds is left out (its member went away;
its machines' agents heartbeat to another member, whose partial counts them).

A machine whose heartbeats move from one replica to another (a change of health owner) counts in
both until the first replica's book lets it go (UsageBook.stale, a few heartbeat intervals).

Each task's own figures are not in the partials (they follow the tasks): `tasks` asks the other
replicas for those it wants when it wants them (`peer_tasks`, usage/peers.py), and adds its book's."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Collection, Iterable

from controlplane.usage.book import Cell, TaskUsage, UsageBook, in_slices

# the other replicas' task figures: (jobs, entitlements) -> theirs (None for both: every job's)
AskPeers = Callable[[Collection[str] | None, Collection[str] | None], Awaitable[list[TaskUsage]]]
CELL_FIGURES = 7  # tasks' millicores, tasks' MiB, hosts' millicores, hosts' MiB, milliwatts, machines, machines with power


def add_into(out: dict, key, figures) -> None:
    """out[key] += figures, element by element (a copy when the key is new)."""
    s = out.get(key)
    if s is None:
        out[key] = list(figures)
    else:
        for i, v in enumerate(figures):
            s[i] += v


class RegionUsage:
    def __init__(self, book: UsageBook, stale: float = 5.0):
        self.book = book
        self.stale = stale
        self.peers: dict[str, tuple[float, dict[str, list[int]], dict[Cell, list[int]]]] = {}
        self._swept = float("-inf")
        self.peer_tasks: AskPeers | None = None  # None: no other replica to ask (tests)

    def _sweep(self, now: float) -> None:
        """The book lets go of machines gone silent: a pass over its machines, once a second at most."""
        if now - self._swept >= 1.0:
            self._swept = now
            self.book.sweep(now)

    # -- the partials --------------------------------------------------------------------------

    def partial(self, now: float | None = None) -> dict:
        """This replica's sums, as the relay sends them (frontend/schema.py UsagePartial)."""
        self._sweep(time.monotonic() if now is None else now)
        return {"jobs": self.book.jobs, "cells": [[*cell, *figures] for cell, figures in self.book.cells.items()]}

    def receive(self, member: str, partial, now: float | None = None) -> None:
        """A peer's partial (schema.UsagePartial) replaces its last."""
        jobs = {handle: list(v) for handle, v in partial.jobs.items()}
        cells = {tuple(c[:5]): list(c[5:]) for c in partial.cells}
        self.peers[member] = (time.monotonic() if now is None else now, jobs, cells)

    def forget(self, member: str) -> None:
        self.peers.pop(member, None)

    def _live(self, now: float | None) -> Iterable[tuple[dict[str, list[int]], dict[Cell, list[int]]]]:
        now = time.monotonic() if now is None else now
        self._sweep(now)
        yield self.book.jobs, self.book.cells
        for member, (at, jobs, cells) in list(self.peers.items()):
            if now - at > self.stale:
                del self.peers[member]
                continue
            yield jobs, cells

    # -- what the region uses ------------------------------------------------------------------

    def _summed(self, part: int, now: float | None, only=None) -> dict:
        """Part 0 (jobs) or 1 (cells) of every live sum, added up; `only`: that key alone."""
        out: dict = {}
        for sums in self._live(now):
            if only is None:
                for key, figures in sums[part].items():
                    add_into(out, key, figures)
            elif (figures := sums[part].get(only)) is not None:
                add_into(out, only, figures)
        return out

    def jobs(self, now: float | None = None) -> dict[str, list[int]]:
        """Job handle -> [millicores, MiB, tasks reporting], summed over the replicas."""
        return self._summed(0, now)

    def job(self, handle: str, now: float | None = None) -> list[int] | None:
        return self._summed(0, now, handle).get(handle)

    def cells(self, now: float | None = None) -> dict[Cell, list[int]]:
        """Cell -> its CELL_FIGURES, summed over the replicas."""
        return self._summed(1, now)

    def cell_parts(self, now: float | None = None) -> list[dict[Cell, list[int]]]:
        """Each live replica's cells (this one's book first), copied (their figures lists are
        shared): what cells() sums, for a caller that sums them elsewhere (a scrape's thread)."""
        return [dict(cells) for _, cells in self._live(now)]

    async def own_tasks(self, jobs: Collection[str] | None = None, entitlements: Collection[str] | None = None,
                        now: float | None = None) -> list[TaskUsage]:
        """The task figures this replica's book holds (UsageBook.tasks), the event loop let run
        after each slice of them (UsageBook.tasks_stepwise)."""
        self._sweep(time.monotonic() if now is None else now)
        steps = self.book.tasks_stepwise(jobs, entitlements)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            await asyncio.sleep(0)

    async def tasks(self, jobs: Collection[str] | None = None, entitlements: Collection[str] | None = None,
                    now: float | None = None) -> dict[tuple[str, int, str], TaskUsage]:
        """(job, index, machine) -> that task's last figures there, from this replica's book and the
        others' (`jobs`, or the jobs of `entitlements`, or every job). A machine whose heartbeats
        moved may be in two books for a while: its newer report wins. Merged in slices too."""
        theirs = await self.peer_tasks(jobs, entitlements) if self.peer_tasks is not None else []
        mine = await self.own_tasks(jobs, entitlements, now)
        out: dict[tuple[str, int, str], TaskUsage] = {}
        for part in (theirs, mine):  # (not theirs + mine: a copy of every figure, in one go on the loop)
            async for some in in_slices(part):
                for t in some:
                    key = (t.job, t.index, t.machine)
                    if (had := out.get(key)) is None or t.at > had.at:
                        out[key] = t
        return out
