"""An autoscaled job's load other than CPU (its policy's metric): a Prometheus query on the region's
server (controld --prometheus-url: the operator's, trusted), or a URL of the job's own that answers a
number (a JSON number, {"value": n}, or plain text), called as TaskControllers are: only at addresses
the job's entitlement allows (taskcontrol/reach.py). Fetched before each SRM pass, a few at a time,
each within a timeout; a value keeps the time it was read, so that one not renewed grows stale and
freezes the job's scale-in."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import aiohttp

from controlplane.store.records import JobRec
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach

log = logging.getLogger("twine.controld.srm")
TIMEOUT = 2.0
AT_ONCE = 32
MAX_BODY = 64 * 1024


class LoadError(ValueError):
    pass


def number(value: object) -> float:
    """A finite number >= 0 from an answer's value; LoadError otherwise."""
    if isinstance(value, dict) and "value" in value:
        value = value["value"]
    if isinstance(value, bool):
        raise LoadError(f"{value!r} is not a number")
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LoadError(f"{str(value)[:60]!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise LoadError(f"{v} is not a load (finite, >= 0)")
    return v


def prometheus_value(answer: object) -> float:
    """The value of an instant query's answer: a scalar, or the sum of a vector's samples."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise LoadError(f"the query failed: {str(answer)[:200]}")
    data = answer.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return number(result[1])
    if kind == "vector":
        if not result:
            raise LoadError("the query returned no series")
        return sum(number(s["value"][1]) for s in result)
    raise LoadError(f"the query returned a {kind}, not a scalar or vector")


class Loads:
    def __init__(self, state: RegionState, prometheus: str | None = None, reach: Reach | None = None):
        self.state, self.prometheus, self.reach = state, prometheus, reach or Reach()
        self.values: dict[str, tuple[float, float]] = {}  # job -> (value, when read)
        self.errors: dict[str, str] = {}  # job -> why its last read failed
        self._http: dict[tuple[str, ...], aiohttp.ClientSession] = {}

    def value(self, handle: str) -> tuple[float | None, float]:
        v = self.values.get(handle)
        return (None, 0.0) if v is None else v

    async def refresh(self, jobs: list[JobRec], now: float) -> None:
        limit = asyncio.Semaphore(AT_ONCE)

        async def one(job: JobRec) -> None:
            async with limit:
                try:
                    self.values[job.handle] = (await self.read(job), now)
                    self.errors.pop(job.handle, None)
                except (LoadError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                    if self.errors.get(job.handle) != why:
                        log.warning("srm: %s's load not read: %s", job.handle, why)
                    self.errors[job.handle] = why

        await asyncio.gather(*(one(j) for j in jobs))
        gone = {j.handle for j in jobs}
        for h in [h for h in self.values if h not in gone]:
            del self.values[h]

    async def read(self, job: JobRec) -> float:
        m = job.autoscale.metric
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        if m.prometheus is not None:
            if not self.prometheus:
                raise LoadError("this region has no Prometheus server (controld --prometheus-url)")
            async with self._session(None).get(self.prometheus.rstrip("/") + "/api/v1/query",
                                               params={"query": m.prometheus}, timeout=timeout) as r:
                return prometheus_value(json.loads(await r.content.read(MAX_BODY)))
        ent = self.state.entitlements.get(job.entitlement)
        allowed = ent.allow_controller_networks if ent is not None else ()
        if why := await self.reach.check_url(m.http, allowed):
            raise LoadError(why)
        async with self._session(allowed).get(m.http, timeout=timeout) as r:
            if r.status != 200:
                raise LoadError(f"HTTP {r.status}")
            text = (await r.content.read(MAX_BODY)).decode(errors="replace").strip()
        try:
            return number(json.loads(text))
        except json.JSONDecodeError:
            return number(text)

    def _session(self, allowed: tuple[str, ...] | None) -> aiohttp.ClientSession:
        """Prometheus (None): any address; a job's URL: only where its entitlement allows."""
        key = ("<prometheus>",) if allowed is None else allowed
        s = self._http.get(key)
        if s is None:
            connector = aiohttp.TCPConnector() if allowed is None else self.reach.connector(allowed)
            s = self._http[key] = aiohttp.ClientSession(connector=connector)
        return s

    async def close(self) -> None:
        for s in self._http.values():
            await s.close()
        self._http.clear()
