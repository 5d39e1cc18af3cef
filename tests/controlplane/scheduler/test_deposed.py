"""A deposed shard leader's scheduler loop ends, even when the cancel that should end it is lost.

A cancel that reaches an etcd call can come back as that call's error (grpc's CANCELLED), which
the pass takes for a failed commit and retries: issue #12's frozen-scheduler test saw a leader
frozen past its lease go on failing its fenced commits, thousands of passes a second, and never
lead again, because the depose awaiting its loop never returned."""

from __future__ import annotations

import asyncio
import types
import uuid

import pytest

from controlplane.scheduler.service import Scheduler
from controlplane.store.state import RegionState
from controlplane.store.keys import Keys


@pytest.mark.parametrize("deposed", ["its leader key is gone", ""], ids=["deposed", "cancelled-only"])
def test_a_deposed_or_cancelled_scheduler_stops_even_if_its_pass_swallows_the_cancel(deposed):
    """Deposed: ShardHost.depose says why, then cancels. Cancelled only: the daemon stopping."""
    keys = Keys("dp" + uuid.uuid4().hex[:8])
    state = RegionState(types.SimpleNamespace(unavailable=""), keys)  # no etcd call is made: pass_jobs is replaced
    sched = Scheduler(state, None, keys, reports=lambda mid: {})
    passes = 0

    async def pass_jobs(handles) -> None:
        nonlocal passes
        passes += 1
        try:
            await asyncio.sleep(0.001)  # the commit, in flight
        except asyncio.CancelledError:
            pass  # ... comes back as the call's own error, which the pass handles
        state.changed.set({"web/api"})  # its conflict: the job again, at once

    sched.pass_jobs = pass_jobs

    async def body() -> None:
        loop = asyncio.create_task(sched.run())
        try:
            state.changed.set({"web/api"})
            for _ in range(500):
                if passes >= 5 or loop.done():
                    break
                await asyncio.sleep(0.01)
            assert passes >= 5, loop
            sched.deposed = deposed
            loop.cancel()
            done, _ = await asyncio.wait([loop], timeout=2)
            assert done, f"the scheduler's loop still runs after {passes} passes"
            assert loop.cancelled() or loop.exception() is None
        finally:  # a failed check ends the loop too (else asyncio.run's cancel would be swallowed again)
            sched.deposed = sched.deposed or "test over"

    asyncio.run(body())
