"""What holds the event loop: the garbage collector's pauses and the loop's lag, as metrics and
as a warning when the loop was held long enough to put the lease at risk.

One event loop runs everything a control daemon does: heartbeats, the lease's keep-alive, the
scheduler. A turn that runs long (a collection over a large heap, a pass over every machine)
delays all of them at once, and a keep-alive that waits longer than the lease lasts ends every
leadership of the process. These figures say how long and why:

- `twine_event_loop_lag_seconds`: how much later than asked a short sleep woke up (every 0.1 s).
- `twine_event_loop_lag_recent_seconds`: the longest of those lags in the last RECENT seconds (what
  a turn of a scrape, or of an API request, held the loop for: read it after one).
- `twine_gc_pause_seconds{generation}`: each collection of the cyclic garbage collector.

A lag of a third of the lease's TTL or more is logged as a warning, with the collections that ran
meanwhile: the time left is what the keep-alive has. While the loop is held that long, a thread
logs where the loop's thread is (its stack, once a stall): what to make shorter.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections import deque

from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger("twine.controld")

FULL_EVERY = 100  # collections of generation 1 between two full ones (CPython's default: 10)

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)
GC_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)
TICK = 0.1
RECENT = 10.0  # seconds the recent longest lag covers


class Stalls:
    def __init__(self, registry: CollectorRegistry, warn_after: float) -> None:
        self.warn_after = warn_after
        self.lag = Histogram("twine_event_loop_lag_seconds", "How much later than asked a short sleep of the event "
                             "loop woke up", buckets=LAG_BUCKETS, registry=registry)
        gc_pause = Histogram("twine_gc_pause_seconds", "A collection of the cyclic garbage collector",
                             ["generation"], buckets=GC_BUCKETS, registry=registry)
        self.gc_pause = {g: gc_pause.labels(str(g)) for g in range(3)}
        self.longest = 0.0
        self._recent: deque[tuple[float, float]] = deque()  # (when, lag) of the last RECENT seconds' ticks
        Gauge("twine_event_loop_lag_recent_seconds", f"The longest lag of the event loop in the last {RECENT:g} s",
              registry=registry).set_function(self.recent)
        self._gc_started = 0.0
        # (generation, pause) since the last tick. The collector's callback only appends here: it
        # runs wherever a collection is set off, a scrape holding a metric's lock included, so it
        # must take no lock (the tick observes them)
        self._gc_since: list[tuple[int, float]] = []
        self._ticked = time.monotonic()  # the loop's last tick
        self._stopped = threading.Event()

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_since.append((info["generation"], time.perf_counter() - self._gc_started))

    async def run(self) -> None:
        self._stopped.clear()
        gc.callbacks.append(self._on_gc)
        try:
            watcher = threading.Thread(target=self._watch, args=(threading.get_ident(),), name="twine-stalls",
                                       daemon=True)
            watcher.start()
            while True:
                self._ticked = t0 = time.monotonic()
                await asyncio.sleep(TICK)
                lag = time.monotonic() - t0 - TICK
                collections, self._gc_since = self._gc_since, []
                for generation, pause in collections:
                    self.gc_pause[generation].observe(pause)
                self.observe(lag, collections)
        finally:
            self._stopped.set()
            gc.callbacks.remove(self._on_gc)

    def _watch(self, loop_thread: int) -> None:
        """Off the loop: where the loop's thread is while it is held (once a stall)."""
        told = 0.0
        while not self._stopped.wait(TICK):
            ticked = self._ticked
            held = time.monotonic() - ticked - TICK
            if held >= self.warn_after and ticked != told:
                told = ticked
                frame = sys._current_frames().get(loop_thread)  # noqa: SLF001 - the documented way to another thread's stack
                where = "".join(traceback.format_stack(frame, limit=12)) if frame is not None else "(not found)\n"
                log.warning("the event loop has been held for %.2fs so far, in:\n%s", held, where.rstrip())

    def observe(self, lag: float, collections: list[tuple[int, float]]) -> None:
        lag = max(lag, 0.0)
        self.lag.observe(lag)
        self.longest = max(self.longest, lag)
        now = time.monotonic()
        self._recent.append((now, lag))
        while self._recent and self._recent[0][0] < now - RECENT:
            self._recent.popleft()
        if lag >= self.warn_after:
            in_gc = sum(p for _, p in collections)
            full = [p for g, p in collections if g == 2]
            log.warning("the event loop was held for %.2fs (lease keep-alives, heartbeats and the scheduler waited); "
                        "garbage collection took %.2fs of it in %d collection(s)%s", lag, in_gc, len(collections),
                        f", the longest full one {max(full):.2f}s" if full else "")


    def recent(self) -> float:
        """The longest lag of the ticks in the last RECENT seconds (0: none)."""
        now = time.monotonic()
        return max((lag for at, lag in self._recent if at >= now - RECENT), default=0.0)


def tune_collector() -> None:
    """How often the cyclic garbage collector makes a full pass, for a control daemon.

    The region read at start is frozen out of the full passes (RegionState.snapshot: gc.freeze).
    CPython makes a full pass only when the objects that survived its last one have grown by a
    quarter, but it counts no frozen object: after the freeze it finds almost none, and so runs
    a full pass every 10 collections of generation 1, each through every object made since the
    start. At 100,000 machines that was a pause of 60-110 ms about every 250 jobs placed (and
    more as the region's records are replaced). A tenth as often leaves each pass as it was; in
    one process, 1,000 jobs through the daemon's commit path at 100,000 machines (bench_commit's
    (2), twice each way) went from 254 and 267 jobs/s to 282 and 299, with no full pass. Young
    collections are left as they are. (CPython 3.14's incremental collector ignores this
    threshold; this daemon runs on 3.11.)"""
    g0, g1, _ = gc.get_threshold()
    gc.set_threshold(g0, g1, FULL_EVERY)
