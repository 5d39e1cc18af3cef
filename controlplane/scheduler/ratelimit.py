"""Rate limits on destructive operations (paper section 4): token buckets per job, per shard and
per region on stops and moves, whatever their cause, so that a bug cannot shuffle the fleet.

An operation needs a token from all three buckets. The scheduler asks how many it may do now
(`available`), does at most that many, and takes the tokens for what it commits (`take`).

The buckets live in etcd too, so that neither a restart nor a change of shard leader refills them:
`take` returns the records (/twine/<region>/ratelimits/shard-NNNN with the shard's and its jobs'
buckets; .../region) that the scheduler writes in the same transaction as the operations they pay
for, and a new leader starts from them (`load`). Times there are wall-clock seconds.

A job's and a shard's buckets have one writer, the shard's leader. The region's bucket is shared by
every shard: the limiter reads it from the region's view at each use (`region`: the record and the
revision it was read at), and the transaction that spends from it is guarded by that revision,
so two shards never spend the same tokens: the later commit conflicts, and its next pass reads
what the other left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from controlplane.store import Conflict


@dataclass
class TokenBucket:
    rate: float  # tokens per second
    burst: float  # capacity
    tokens: float = -1.0
    at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def available(self, now: float | None = None) -> float:
        self._refill(time.time() if now is None else now)
        return self.tokens

    def take(self, n: float, now: float | None = None) -> None:
        self._refill(time.time() if now is None else now)
        self.tokens -= n

    def to_json(self) -> dict:
        return {"tokens": round(self.tokens, 6), "at": self.at}

    def load(self, d: dict | None) -> None:
        if d:
            self.tokens, self.at = min(float(d["tokens"]), self.burst), float(d["at"])


@dataclass(frozen=True)
class Limits:
    """rate (tokens/s) and burst per scope."""

    job: tuple[float, float] = (1.0, 10.0)
    shard: tuple[float, float] = (10.0, 100.0)
    region: tuple[float, float] = (20.0, 200.0)

    @classmethod
    def parse(cls, text: str) -> Limits:
        """`job=1:10,shard=10:100,region=20:200` (any subset)."""
        values = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            scope, _, spec = part.partition("=")
            rate, _, burst = spec.partition(":")
            if scope not in ("job", "shard", "region"):
                raise ValueError(f"{part!r}: scope must be job, shard or region")
            try:
                values[scope] = (float(rate), float(burst or rate))
            except ValueError:
                raise ValueError(f"{part!r}: want SCOPE=RATE:BURST, e.g. job=1:10") from None
            if values[scope][0] < 0 or values[scope][1] < 1:
                raise ValueError(f"{part!r}: rate must be >= 0 and burst >= 1")
        return cls(**values)


RegionRecord = Callable[[], tuple[dict | None, int]]  # the region bucket's record and its mod revision


class Limiter:
    def __init__(self, limits: Limits = Limits(), shard: int = 0, region: RegionRecord | None = None):
        self.limits = limits
        self.shard_id = shard
        self.jobs: dict[str, TokenBucket] = {}
        self.shard = TokenBucket(*limits.shard)
        self.region = TokenBucket(*limits.region)
        # the region's bucket as the view has it (None: this limiter's own, a test's)
        self.region_record = region
        self._region_revision = 0  # the revision of the record self.region was read from
        self.held_total = 0  # operations held back by a limit (metric)

    def _read_region(self) -> None:
        """The region's bucket read again when the view's record changed (another shard spent, or
        our own commit came back through the watch)."""
        if self.region_record is None:
            return
        record, revision = self.region_record()
        if revision != self._region_revision:
            self.region = TokenBucket(*self.limits.region)
            self.region.load(record)
            self._region_revision = revision

    def _job(self, handle: str) -> TokenBucket:
        if handle not in self.jobs:
            self.jobs[handle] = TokenBucket(*self.limits.job)
        return self.jobs[handle]

    def available(self, handle: str) -> int:
        self._read_region()
        return int(min(self._job(handle).available(), self.shard.available(), self.region.available()))

    def take(self, handle: str, n: int) -> dict[str, dict]:
        """Take n tokens from each bucket; the records to write with the operations (scope -> record),
        the region's to be guarded by the view's revision of it (just read). Conflict when a bucket no longer holds n
        (another shard spent from the region's since the operations were planned)."""
        if not n:
            return {}
        self._read_region()
        now = time.time()
        buckets = {"job": self._job(handle), "shard": self.shard, "region": self.region}
        short = [scope for scope, b in buckets.items() if b.available(now) < n - 1e-9]
        if short:
            raise Conflict(f"{handle}: the {short[0]} rate limit holds fewer than {n} token(s) now; planned again")
        for bucket in buckets.values():
            bucket.take(n, now)
        return self.records()

    def records(self) -> dict[str, dict]:
        now = time.time()
        # a job bucket that has refilled holds nothing worth keeping
        jobs = {h: b.to_json() for h, b in self.jobs.items() if b.available(now) < b.burst}
        return {self.scope(): {**self.shard.to_json(), "jobs": jobs}, "region": self.region.to_json()}

    def scope(self) -> str:
        return f"shard-{self.shard_id:04d}"

    def load(self, records: dict[str, dict]) -> None:
        """Start from the buckets as etcd has them (a new leader; a commit that lost)."""
        self.jobs.clear()
        self.shard = TokenBucket(*self.limits.shard)
        self.region = TokenBucket(*self.limits.region)
        self._region_revision = 0
        mine = records.get(self.scope()) or {}
        self.shard.load(mine)
        self.region.load(records.get("region"))
        for h, d in (mine.get("jobs") or {}).items():
            self._job(h).load(d)
        self._read_region()

    def forget(self, handle: str) -> None:
        self.jobs.pop(handle, None)

    def which(self, handle: str) -> str:
        """The scope that holds operations back now (for job status)."""
        self._read_region()
        levels = {"job": self._job(handle).available(), "shard": self.shard.available(),
                  "region": self.region.available()}
        return min(levels, key=levels.get)
