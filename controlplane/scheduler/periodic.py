"""The periodic work of a shard's leader beside its scheduling passes (its profile rollouts, its
reclaims, and for shard 0 the pool's capacity history): a step every `interval` seconds while the
region's view is fresh; a step that fails is counted (a conflict: someone wrote first; anything
else: logged) and the next one tries again."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from controlplane.store import Conflict
from controlplane.store.state import RegionState


async def every(interval: float, state: RegionState, step: Callable[[float], Awaitable[None]],
                counters: dict[str, int], log: logging.Logger, what: str) -> None:
    while True:
        await asyncio.sleep(interval)
        if state.stale:  # plans from a view behind etcd would only fail or conflict
            continue
        try:
            await step(time.time())
        except asyncio.CancelledError:
            raise
        except Conflict:
            counters["conflicts"] += 1
        except Exception:  # the next pass tries again
            counters["errors"] += 1
            log.exception("%s failed", what)
