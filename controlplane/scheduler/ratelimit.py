"""Rate limits on destructive operations (paper section 4): token buckets per job, per shard and
per region on stops and moves, whatever their cause, so that a bug cannot shuffle the fleet.

An operation needs a token from all three buckets. The scheduler asks how many it may do now
(`available`), does at most that many, and takes the tokens for what it commits (`take`).

The buckets live in etcd too, so that neither a restart nor a change of shard leader refills them:
`take` returns the records (/twine/<region>/ratelimits/shard-NNNN with the shard's and its jobs'
buckets; .../region) that the scheduler writes in the same transaction as the operations they pay
for, and a new leader starts from them (`load`). Times there are wall-clock seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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


class Limiter:
    def __init__(self, limits: Limits = Limits(), shard: int = 0):
        self.limits = limits
        self.shard_id = shard
        self.jobs: dict[str, TokenBucket] = {}
        self.shard = TokenBucket(*limits.shard)
        self.region = TokenBucket(*limits.region)
        self.held_total = 0  # operations held back by a limit (metric)

    def _job(self, handle: str) -> TokenBucket:
        if handle not in self.jobs:
            self.jobs[handle] = TokenBucket(*self.limits.job)
        return self.jobs[handle]

    def available(self, handle: str) -> int:
        return int(min(self._job(handle).available(), self.shard.available(), self.region.available()))

    def take(self, handle: str, n: int) -> dict[str, dict]:
        """Take n tokens from each bucket; the records to write with the operations (scope -> record)."""
        if not n:
            return {}
        for bucket in (self._job(handle), self.shard, self.region):
            bucket.take(n)
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
        mine = records.get(self.scope()) or {}
        self.shard.load(mine)
        self.region.load(records.get("region"))
        for h, d in (mine.get("jobs") or {}).items():
            self._job(h).load(d)

    def forget(self, handle: str) -> None:
        self.jobs.pop(handle, None)

    def which(self, handle: str) -> str:
        """The scope that holds operations back now (for job status)."""
        levels = {"job": self._job(handle).available(), "shard": self.shard.available(),
                  "region": self.region.available()}
        return min(levels, key=levels.get)
