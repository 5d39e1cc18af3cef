"""The pool's history for opportunistic capacity's SLO (capacity/slo.py), kept in etcd by the
process that leads shard 0, and read from etcd by any replica that answers /v1/capacity/forecast
or /v1/capacity/slo (a change of leader loses at most the hour under way).

In etcd, under /twine-usage/<region>/capacity/<hour> (the hour since the epoch, zero-padded): per
group, the hour's least available, most machines, most guaranteed, most opportunistic and most
reclaiming, and the lines offered for the 24 hours after it. Written at each hour's end; records
older than 8 weeks go then."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from controlplane.capacity import slo
from controlplane.scheduler.periodic import every
from controlplane.store import Store
from controlplane.store.state import RegionState

log = logging.getLogger("twine.controld.capacity")
SAMPLE = 60.0  # seconds between looks at the pool (from the sums kept as machines change: store/cells.py)
LEAST = ("available",)  # figures whose hour's value is the least seen; the others keep the most


class CapacityRecorder:
    def __init__(self, state: RegionState, store: Store, leads_shard0: Callable[[], bool], sample: float = SAMPLE,
                 clock: Callable[[], float] = time.time):
        self.state, self.store, self.leads, self.sample, self.clock = state, store, leads_shard0, sample, clock
        self.prefix = f"/twine-usage/{state.keys.region}/capacity/"
        self.hour: int | None = None  # the hour being sampled (None: not leading shard 0)
        self.current: dict[str, dict[str, int]] = {}  # its figures so far
        self.counters = {"samples": 0, "hours_written": 0, "conflicts": 0, "errors": 0}
        # for Prometheus (capacity/metrics.py), while this process leads shard 0: per group, the
        # line offered for the hour under way, and the hours judged and delivered so far
        self.offered_now: dict[str, int | None] = {}
        self.last: dict[str, dict[str, int]] = {}  # the pool at the last look
        self.kept: dict[str, dict] = {}

    def key(self, hour: int) -> str:
        return f"{self.prefix}{hour:08d}"

    async def run(self) -> None:
        await every(self.sample, self.state, self.tick, self.counters, log, "capacity history")

    async def tick(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        if not self.leads():
            self.hour, self.current, self.last = None, {}, {}
            return
        hour = int(now // 3600)
        figures = self.last = slo.pool(self.state, now)
        if self.hour is not None and hour > self.hour:
            await self.close(self.hour, figures)
        if self.hour is None:  # leading shard 0 from now on: what etcd says was offered and kept
            self._judge(await self.history(), hour)
        if self.hour != hour:
            self.hour, self.current = hour, {}
        for group, f in figures.items():
            seen = self.current.setdefault(group, dict(f))
            for name, value in f.items():
                seen[name] = min(seen[name], value) if name in LEAST else max(seen[name], value)
        self.counters["samples"] += 1

    async def close(self, hour: int, now_pool: dict[str, dict[str, int]]) -> None:
        """The hour's record, with the lines offered for the 24 hours after it (made from the
        history with this hour in it and the pool as it is now), and the records past 8 weeks gone."""
        h = await self.history()
        h.put(hour, {"groups": self.current})
        h.offered[hour] = slo.offer(await asyncio.to_thread(slo.forecast, h, now_pool, hour))
        await self.store.commit([], {self.key(hour): h.record(hour)},
                                [(self.prefix, self.key(hour - slo.HOURS_KEPT + 1))])  # and past 8 weeks, gone
        self.counters["hours_written"] += 1
        self._judge(h, hour + 1)

    def _judge(self, h: slo.History, hour: int) -> None:
        self.kept = slo.delivered(h)
        self.offered_now = {}
        for lead in range(1, slo.LEADS + 1):  # the offer made latest for the hour under way
            for group, line in h.offered.get(hour - lead, {}).items():
                if group not in self.offered_now and len(line) >= lead:
                    self.offered_now[group] = line[lead - 1]

    async def history(self) -> slo.History:
        """What etcd keeps (8 weeks: at most 1,344 small records)."""
        recs, _ = await self.store.range(self.prefix)
        h = slo.History()
        for rec in recs:
            try:
                h.put(int(rec.key.rsplit("/", 1)[1]), rec.value)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                log.warning("capacity record %s left out: %s", rec.key, e)
        return h
