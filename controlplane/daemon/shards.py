"""The scheduler shards this process leads: a Scheduler and its loop each, begun when the
coordinator wins the shard's election and ended when the leadership ends (coordination/)."""

from __future__ import annotations

import asyncio

from controlplane.broker.agents import AgentService
from controlplane.coordination.coordinator import Fence
from controlplane.scheduler.lifecycle import LifecycleMetrics
from controlplane.scheduler.ratelimit import Limits
from controlplane.scheduler.service import Scheduler
from controlplane.store import Store
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach

# what the shards this process led counted, kept when their leadership ends
RETIRED = {"passes": 0, "commits": 0, "conflicts": 0, "placements": 0, "errors": 0, "rate_limited": 0}


class ShardHost:
    def __init__(self, state: RegionState, store: Store, agents: AgentService, metrics: LifecycleMetrics,
                 limits: Limits = Limits(), taskcontrol_interval: float = 1.0, maintenance_policy: str = "move",
                 max_txn_ops: int = 128, reach: Reach | None = None, rollout_interval: float = 1.0):
        self.state, self.store = state, store
        self.agents = agents  # the task reports and desired-state errors its schedulers read
        self.metrics = metrics
        self.limits = limits
        self.taskcontrol_interval = taskcontrol_interval
        self.maintenance_policy = maintenance_policy
        self.max_txn_ops = max_txn_ops
        self.reach = reach  # where TaskControllers may be
        self.rollout_interval = rollout_interval
        self.schedulers: dict[int, Scheduler] = {}  # the shards this process leads now
        self._loops: dict[int, asyncio.Task] = {}
        self.retired = dict(RETIRED)

    def local(self, shard: int) -> Scheduler | None:
        return self.schedulers.get(shard)

    def scheduler_for(self, handle: str) -> Scheduler | None:
        """The local scheduler of the job's shard, if this process leads it."""
        shard = self.state.shard_of_job(handle)
        return None if shard is None else self.schedulers.get(shard)

    def counters(self) -> dict[str, int]:
        """The schedulers' counters, of the shards led now and of those led before."""
        out = dict(self.retired)
        for sc in self.schedulers.values():
            for k, v in sc.counters.items():
                out[k] = out.get(k, 0) + v
        return out

    async def lead(self, fence: Fence) -> None:
        # everything up to the election is in our view before we act on it (the rate-limit
        # buckets and operations in flight the scheduler starts from, among the rest)
        await self.state.wait_for(fence.epoch)
        sched = Scheduler(self.state, self.store, self.state.keys, self.agents.report_of, self.agents.errors,
                          self.limits, self.taskcontrol_interval, maintenance_policy=self.maintenance_policy,
                          shard=fence.shard, fence=fence, max_txn_ops=self.max_txn_ops, metrics=self.metrics,
                          reach=self.reach, rollout_interval=self.rollout_interval)
        self.state.snapshot()  # the allocator's index is built now, not by the first job's request
        self.schedulers[fence.shard] = sched
        self._loops[fence.shard] = asyncio.get_running_loop().create_task(sched.run())
        self.state.changed.set()

    async def depose(self, shard: int, why: str) -> None:
        sched = self.schedulers.pop(shard, None)
        loop = self._loops.pop(shard, None)
        if sched is not None:
            sched.deposed = why
            for k, v in sched.counters.items():
                self.retired[k] = self.retired.get(k, 0) + v
        if loop is not None:
            loop.cancel()
            try:
                await loop
            except BaseException:  # cancelled, or it had failed: either way it is over
                pass

    async def stop(self) -> None:
        for shard in list(self.schedulers):
            await self.depose(shard, "stopping")
