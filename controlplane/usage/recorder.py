"""The usage history of the jobs and entitlements of the shards this process leads (usage/history.py),
sampled from the region's current usage (usage/region.py) every `sample` seconds, and kept in etcd
at each hour's end, so that a restart or a change of shard leader loses at most the current hour.
A new leader loads what its predecessor kept when it takes the shard.

In etcd, under /twine-usage/<region>/ (outside the region's records, which every replica watches):
- minutes/<kind>/<name>/<hour>: the hour's points, kept 48 hours;
- hours/<kind>/<name>/<day>: the day's hourly rollups, kept 8 weeks;
- series/<kind>/<name>: that the series has records (for the retention pass);
- srm/<job>: what the SRM keeps of an autoscaled job (srm/service.py), removed with the job's.
(<kind>: job or entitlement; <hour>, <day>: since the epoch, zero-padded.)

Retention: records older than their window go at each hour's end; the records of a job or an
entitlement the region no longer has (stopped, deleted) go at the next hourly pass of the leader of
shard 0. Machines have no history of their own: a machine that moves to another entitlement leaves
nothing behind; its usage counts in the series of the jobs it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable

from controlplane.store import Store
from controlplane.store.state import RegionState
from controlplane.usage import history as H
from controlplane.usage.region import RegionUsage

log = logging.getLogger("twine.controld.usage")
SAMPLE = 10.0  # seconds between samples (--usage-sample)
KINDS = ("job", "entitlement")
Key = tuple[str, str]  # (kind, name)


class UsageKeys:
    def __init__(self, region: str):
        self.root = f"/twine-usage/{region}/"

    def minutes(self, key: Key, hour: int | None = None) -> str:
        return f"{self.root}minutes/{key[0]}/{key[1]}/" + ("" if hour is None else f"{hour:08d}")

    def hours(self, key: Key, day: int | None = None) -> str:
        return f"{self.root}hours/{key[0]}/{key[1]}/" + ("" if day is None else f"{day:06d}")

    def series(self, key: Key | None = None) -> str:
        return f"{self.root}series/" + ("" if key is None else f"{key[0]}/{key[1]}")

    def srm(self, handle: str = "") -> str:
        """The SRM's record of a job: its last resizes and its size over time (srm/service.py)."""
        return f"{self.root}srm/{handle}"


def end_of(prefix: str) -> str:
    """The first key after every key under prefix (which ends in "/")."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Recorder:
    def __init__(self, state: RegionState, store: Store, usage: RegionUsage, led: Callable[[], Iterable[int]],
                 sample: float = SAMPLE, clock: Callable[[], float] = time.time, max_txn_ops: int = 128):
        self.state, self.store, self.usage = state, store, usage
        self.led = led  # the shards this process leads now
        self.sample, self.clock, self.max_txn_ops = sample, clock, max_txn_ops
        self.keys = UsageKeys(state.keys.region)
        self.series: dict[Key, H.Series] = {}
        self._hour: int | None = None  # the hour of the last tick
        self.counters = {"samples": 0, "hours_written": 0, "records_written": 0, "records_loaded": 0,
                         "records_unreadable": 0, "series_removed": 0, "write_failures": 0}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.sample)
            try:
                await self.tick()
            except Exception as e:  # etcd away for longer than its retries: the next tick tries again
                self.counters["write_failures"] += 1
                log.warning("usage history: %s: %s", type(e).__name__, e)

    def wanted(self) -> set[Key]:
        """The series of the shards led here."""
        shards = set(self.led())
        if not shards:
            return set()
        out = {("job", h) for h in self.state.jobs if self.state.shard_of_job(h) in shards}
        out |= {("entitlement", n) for n, e in self.state.entitlements.items() if e.shard in shards}
        return out

    async def tick(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        wanted = self.wanted()
        for key in set(self.series) - wanted:  # another process leads it now, or it is gone
            del self.series[key]
        new = wanted - set(self.series)
        if new:
            await self._load(new, now)
        hour = int(now // 3600)
        if self._hour is not None and hour > self._hour:
            await self._close_hour(self._hour, now)
        self._hour = hour
        jobs = self.usage.jobs()
        ents: dict[str, list[int]] = {}
        for handle, (cpu, mem, _) in jobs.items():
            job = self.state.jobs.get(handle)
            if job is not None:
                s = ents.setdefault(job.entitlement, [0, 0])
                s[0] += cpu
                s[1] += mem
        for key, series in self.series.items():
            figures = jobs.get(key[1]) if key[0] == "job" else ents.get(key[1])
            if figures is not None:
                series.sample(now, figures[0], figures[1])
                self.counters["samples"] += 1

    # -- etcd ---------------------------------------------------------------------------------

    async def _close_hour(self, hour: int, now: float) -> None:
        """The hour's points and rollups go to etcd; records past their window go."""
        puts: dict[str, dict] = {}
        deletes: list[str | tuple[str, str]] = []
        day = hour // 24
        for key, series in self.series.items():
            if series.close_hour(hour) is None:
                continue
            puts[self.keys.minutes(key, hour)] = H.hour_record(series, hour)
            puts[self.keys.hours(key, day)] = H.day_record(series, day)
            puts[self.keys.series(key)] = {}
            deletes.append((self.keys.minutes(key), self.keys.minutes(key, hour - H.MINUTES // 60 + 1)))
            deletes.append((self.keys.hours(key), self.keys.hours(key, day - H.HOURS // 24)))
        await self._write(puts, deletes)
        self.counters["hours_written"] += 1
        if 0 in set(self.led()):
            await self._remove_gone()

    async def _write(self, puts: dict[str, dict], deletes: list) -> None:
        """In transactions of at most max_txn_ops operations (no guard: only the leader writes a
        series, and a deposed leader's last write holds the same figures)."""
        ops = [(k, v) for k, v in puts.items()] + [(d, None) for d in deletes]
        for i in range(0, len(ops), self.max_txn_ops):
            chunk = ops[i:i + self.max_txn_ops]
            await self.store.commit([], {k: v for k, v in chunk if v is not None},
                                    [k for k, v in chunk if v is None])
        self.counters["records_written"] += len(puts)

    async def _remove_gone(self) -> None:
        markers, _ = await self.store.range(self.keys.series())
        deletes: list[str | tuple[str, str]] = []
        for rec in markers:
            kind, _, name = rec.key[len(self.keys.series()):].partition("/")
            if (self.state.jobs if kind == "job" else self.state.entitlements).get(name) is None:
                key = (kind, name)
                deletes += [(self.keys.minutes(key), end_of(self.keys.minutes(key))),
                            (self.keys.hours(key), end_of(self.keys.hours(key))), rec.key]
                self.counters["series_removed"] += 1
                log.info("usage history of %s %s removed: the region has no such %s", kind, name, kind)
        kept, _ = await self.store.range(self.keys.srm())  # the SRM's record of a job (srm/service.py)
        for rec in kept:
            if self.state.jobs.get(rec.key[len(self.keys.srm()):]) is None:
                deletes.append(rec.key)
                self.counters["series_removed"] += 1
        await self._write({}, deletes)

    async def _load(self, keys: set[Key], now: float) -> None:
        """What etcd keeps of series this process begins to lead (ten at a time)."""
        hour, limit = int(now // 3600), asyncio.Semaphore(10)

        async def one(key: Key) -> None:
            series = H.Series()
            async with limit:
                minutes, _ = await self.store.range(self.keys.minutes(key))
                days, _ = await self.store.range(self.keys.hours(key))
            for recs, loader, scale in ((minutes, H.load_hour, 1), (days, H.load_day, 24)):
                for rec in recs:
                    try:
                        at = int(rec.key.rsplit("/", 1)[1])
                        if at * scale > hour - (H.MINUTES // 60 if scale == 1 else H.HOURS):
                            loader(series, at, rec.value)
                            self.counters["records_loaded"] += 1
                    except (ValueError, KeyError, TypeError) as e:
                        self.counters["records_unreadable"] += 1
                        log.warning("usage record %s left out: %s", rec.key, e)
            self.series[key] = series

        await asyncio.gather(*(one(k) for k in sorted(keys)))
