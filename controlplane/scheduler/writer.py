"""What a shard's leader writes: a job's task changes committed in transactions that fit etcd's
limits, each fenced by the leadership and guarded by the revisions it was computed from (txn.py),
paying the destructive rate limits' tokens in the same transaction (ratelimit.py).

A lost race is a Conflict: nothing of that transaction was written, and the next pass over the job
sees the winner's write (level-triggered: the reconciler does the rest from the job record).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from controlplane.allocator import Placement
from controlplane.scheduler.placement import placement_changes
from controlplane.scheduler.ratelimit import Limiter
from controlplane.scheduler.txn import MAX_TXN_BYTES, Change, Txn, task_bytes
from controlplane.store import Store
from controlplane.store.keys import Keys
from controlplane.store.records import JobRec, TaskRec
from controlplane.store.state import RegionState

if TYPE_CHECKING:
    from controlplane.coordination.coordinator import Fence

log = logging.getLogger("twine.controld.scheduler")


class ShardWriter:
    def __init__(self, state: RegionState, store: Store, keys: Keys, shard: int, owns: Callable[[str], bool],
                 limiter: Limiter, counters: dict[str, int], fence: "Fence | None" = None, max_txn_ops: int = 128):
        self.state, self.store, self.keys = state, store, keys
        self.shard, self.owns, self.fence = shard, owns, fence
        self.limiter = limiter
        self.counters = counters  # the scheduler's (commits, batches, placements)
        self.max_txn_ops = max_txn_ops
        self.elected_at = time.time()
        self.first_commit_at: float | None = None  # wall time of the first commit as leader

    def txn(self) -> Txn:
        return Txn(self.state, self.keys, self.shard, self.owns, self.fence)

    async def send(self, txn: Txn) -> int:
        rev = await self.store.commit(*txn.finish())
        self.counters["commits"] += 1
        if self.first_commit_at is None:
            self.first_commit_at = time.time()
            log.warning("shard %d: first commit as leader %.3fs after the election", self.shard,
                        self.first_commit_at - self.elected_at)
        return rev

    async def commit_placement(self, job: JobRec, placement: Placement, indices: tuple[int, ...],
                               job_put: JobRec | None = None, deletes: tuple[TaskRec, ...] = (),
                               destructive: int = 0, extra: dict[str, dict] | None = None) -> int:
        changes, taken = placement_changes(self.state, job, placement, indices, deletes)
        rev = await self.commit(job, changes, job_put=job_put, taken=taken, destructive=destructive, extra=extra)
        self.counters["placements"] += 1
        for old, new in changes:
            if new is not None:
                log.info("%s #%d -> %s (%s)", job.handle, new.index, new.machine, new.reason)
        return rev

    async def commit(self, job: JobRec, changes: list[Change], job_put: JobRec | None = None,
                     taken: set[str] = frozenset(), destructive: int = 0, extra: dict[str, dict] | None = None,
                     guarded: tuple[str, ...] = ()) -> int:
        """Commit a job's task changes in transactions that fit etcd's limit on operations
        (`max_txn_ops`, etcd's default 128): one when they fit, else bounded batches, each waited
        for before the next is computed. The job record is the recorded intent: a new job's goes in
        the first batch (no task ever exists without its job) and a stopped job's in the last (it
        is stopped once its tasks are gone). If a batch loses a race, what landed stays and the
        reconciler, level-triggered, does the rest from the job record on its next pass."""
        per_batch = max(1, (self.max_txn_ops - 8) // 5)  # a task: its record, discovery, machine; guards
        # and in bytes: each task's record carries the job's template
        per_batch = max(1, min(per_batch, MAX_TXN_BYTES // task_bytes(job)))
        if len(changes) <= per_batch:
            return await self._commit_one(job, changes, job_put, taken, destructive, extra, guarded)
        batches = [changes[i:i + per_batch] for i in range(0, len(changes), per_batch)]
        last = len(batches) - 1
        job_first = job_put is not None and job_put.state != "stopped"
        rev = 0
        for n, batch in enumerate(batches):
            machines = {t.machine for pair in batch for t in pair if t is not None and t.machine}
            rev = await self._commit_one(
                job, batch, job_put if (n == 0 if job_first else n == last) else None, set(taken) & machines,
                destructive if n == 0 else 0, extra if n == last else None, guarded if n == last else ())
            self.counters["batches"] += 1
            if n < last:
                await self.state.wait_for(rev)  # the next batch's guards are this one's results
        return rev

    async def _commit_one(self, job: JobRec, changes: list[Change], job_put: JobRec | None = None,
                          taken: set[str] = frozenset(), destructive: int = 0,
                          extra: dict[str, dict] | None = None, guarded: tuple[str, ...] = ()) -> int:
        """One transaction for a job's task changes and everything that follows from them, fenced
        by this shard's leadership and the job's entitlement record (its shard). `guarded`: keys
        of `extra` that must be as this view has them (another writer may change them too)."""
        txn = self.txn()
        txn.add(job, changes, job_put, taken, extra)
        for key in guarded:
            txn.guards[key] = self.state.guard(key)
        if destructive:
            for scope, record in self.limiter.take(job.handle, destructive).items():
                rkey = self.keys.ratelimit(scope)
                # guarded as the view has it, which take() has just read: the region's bucket, shared
                # by every shard, is spent once (a shard that spent it since makes this a conflict)
                txn.guards[rkey] = self.state.guard(rkey)
                txn.puts[rkey] = record
        try:
            return await self.send(txn)
        except BaseException:
            if destructive:
                self.limiter.load(self.state.ratelimits)  # the tokens were not spent
            raise
