"""Job creates at a shard's leader, committed in groups.

A create places a new job and commits it with its tasks, provided the job's record is still as the
front end read it (absent, or a stopped job: its read revision). AllocationError: it cannot fit;
Conflict: someone else wrote the job. Nothing is written then.

Group commit: creates that arrive while a transaction is in flight go together into the next one,
as many as fit in etcd's limits, each placed on the snapshot as the ones before it in the batch
left it. One round trip to etcd and one watch event then serve them all, where one create at a
time made the shard's creates wait for each other's round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Awaitable, Callable

from controlplane.allocator import Placement, Snapshot, allocate
from controlplane.allocator.errors import NoPlacement
from controlplane.capacity.reclaim import fits_with_reclaims
from controlplane.scheduler.placement import job_request, placement_changes
from controlplane.scheduler.txn import Txn, task_bytes
from controlplane.scheduler.writer import ShardWriter
from controlplane.store import Conflict, TooLarge
from controlplane.store.records import ApiError, JobRec, TaskRec

log = logging.getLogger("twine.controld.scheduler")
CREATE_RETRIES = 8
Waiting = tuple[JobRec, int, asyncio.Future]  # a create: the job, the revision it was read at, its answer


class Creates:
    def __init__(self, writer: ShardWriter, lock: asyncio.Lock, deposed: Callable[[], str],
                 allocated: Callable[[str, float], None] = lambda why, seconds: None):
        self.writer = writer
        self.state, self.keys = writer.state, writer.keys
        self.allocated = allocated  # observes each allocation: why, seconds
        self.lock = lock  # the shard's: its commits do not race each other
        self.deposed = deposed  # why this shard's leadership ended ("" while it leads)
        self.counters = writer.counters
        self._queue: deque[Waiting] = deque()  # creates waiting for a batch
        self._batcher: asyncio.Task | None = None

    async def create(self, job: JobRec, read_revision: int) -> int:
        """The revision the job's create landed at, once this view has it (read-your-writes)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((job, read_revision, fut))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._batches(), name=f"creates-{self.writer.shard}")
        return await fut

    def _allocate(self, snap: Snapshot, job: JobRec) -> Placement:
        began = time.perf_counter()
        try:
            return allocate(snap, job_request(job))
        finally:
            self.allocated("create", time.perf_counter() - began)

    def _placement(self, snap: Snapshot, job: JobRec) -> Placement | None:
        """Where the job's tasks go; None when they do not fit now but will on opportunistic
        machines taken back for it (a guaranteed job: capacity/reclaim.py). AllocationError else."""
        try:
            return self._allocate(snap, job)
        except NoPlacement:
            if fits_with_reclaims(self.state, job, time.time()):
                return None
            raise

    def _beyond(self, job: JobRec) -> tuple[TaskRec, ...]:
        """A re-run job's tasks beyond its new count: its create deletes them."""
        return tuple(t for t in self.state.tasks.get(job.handle, {}).values() if not job.live(t.index))

    def _fits(self, txn: Txn, job: JobRec) -> bool:
        return txn.fits(job.count + len(self._beyond(job)), self.writer.max_txn_ops, task_bytes(job))

    def deposed_error(self) -> ApiError:
        return ApiError("unavailable", None, f"shard {self.writer.shard}: this process no longer leads it "
                        f"({self.deposed()}); retry")

    def _reject(self, members: list[Waiting], e: BaseException) -> None:
        for _, _, fut in members:
            if not fut.done():
                fut.set_exception(e if isinstance(e, Exception) else self.deposed_error())

    async def _batches(self) -> None:
        try:
            while self._queue:
                job, read_revision, fut = self._queue[0]
                if fut.done():
                    self._queue.popleft()
                elif not self._fits(self.writer.txn(), job):
                    self._queue.popleft()  # too large for one transaction: alone, in bounded batches
                    await _resolve(fut, self._create_alone(job, read_revision))
                else:
                    head = self._queue[0]
                    try:
                        await self._batch()
                    except Exception as e:  # its creates have their answer; the next batch may fare better
                        log.warning("shard %d: a batch of creates failed: %s", self.writer.shard, e)
                        if self._queue and self._queue[0] is head:  # failed before taking any: answer
                            self._queue.popleft()                  # the first, so that the loop moves on
                            if not head[2].done():
                                head[2].set_exception(e)
        finally:
            # cancelled (or a bug): no create waits for an answer that will not come
            while self._queue:
                fut = self._queue.popleft()[2]
                if not fut.done():
                    fut.set_exception(self.deposed_error())

    async def _batch(self) -> None:
        members: list[Waiting] = []
        later: list[Waiting] = []  # a second create of a job in the batch
        async with self.lock:
            txn = self.writer.txn()
            snap = self.state.snapshot()
            while self._queue:
                job, read_revision, fut = self._queue[0]
                if not self._fits(txn, job):
                    break
                self._queue.popleft()
                if fut.done():
                    continue
                if self.deposed():
                    fut.set_exception(self.deposed_error())
                    continue
                if job.handle in txn.jobs:
                    later.append((job, read_revision, fut))
                    continue
                if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision:
                    fut.set_exception(Conflict(f"job {job.handle} was written concurrently"))
                    continue
                try:
                    placement = self._placement(snap, job)
                    if placement is None:  # its tasks wait for machines a reclaim gives it
                        txn.add(job, [(t, None) for t in self._beyond(job)], job_put=job)
                    else:
                        changes, taken = placement_changes(self.state, job, placement, tuple(job.indices()),
                                                           self._beyond(job))
                        txn.add(job, changes, job_put=job, taken=taken)
                except Exception as e:  # AllocationError, most often: this create's answer
                    fut.set_exception(e)
                    continue
                if placement is not None:
                    snap.apply_placement(placement)  # the next create in the batch sees these tasks
                members.append((job, read_revision, fut))
            self._queue.extendleft(reversed(later))
            if not members:
                return
            try:
                rev = await self.writer.send(txn)
            except BaseException as e:
                # the snapshot drops the placements that did not land
                self.state.reread(txn.machines(), txn.tasks)
                if not isinstance(e, (Conflict, TooLarge)):
                    self._reject(members, e)
                    if not isinstance(e, Exception):
                        raise  # cancelled
                    return
                rev = 0
            else:
                self.counters["placements"] += len(members)
                try:
                    # read-your-writes, as a create alone (TimeoutError: etcd went away); and with the
                    # lock held: the shard's next commit is computed from a view that has this one
                    # (a placement guards its machines' records without rewriting them: txn.py)
                    await self.state.wait_for(rev)
                except BaseException as e:
                    self._reject(members, e)
                    raise
        if not rev:  # one create of the batch lost a race, or etcd found the batch too large: each alone
            self.counters["conflicts"] += 1
            for job, read_revision, fut in members:
                await _resolve(fut, self._create_alone(job, read_revision))
            return
        for _, _, fut in members:
            if not fut.done():
                fut.set_result(rev)

    async def _create_alone(self, job: JobRec, read_revision: int) -> int:
        for attempt in range(CREATE_RETRIES):
            if self.deposed():
                raise self.deposed_error()
            async with self.lock:
                if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision:
                    raise Conflict(f"job {job.handle} was written concurrently")
                placement = self._placement(self.state.snapshot(), job)
                try:
                    if placement is None:  # its tasks wait for machines a reclaim gives it
                        rev = await self.writer.commit(job, [(t, None) for t in self._beyond(job)], job_put=job)
                    else:
                        rev = await self.writer.commit_placement(job, placement, tuple(job.indices()), job_put=job,
                                                                 deletes=self._beyond(job))
                except Conflict:
                    if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision \
                            and self.state.jobs.get(job.handle) == job:
                        # a batched create whose first batch (with the job) landed: the job exists;
                        # the scheduler places what a later batch could not
                        self.state.changed.set({job.handle})
                        return self.state.revision
                    # another writer (a replica) changed a machine we chose: see its write, place again
                    self.counters["conflicts"] += 1
                    await asyncio.sleep(0.01 * 2**attempt)
                    continue
                await self.state.wait_for(rev)  # (with the lock held, as _batch)
            return rev
        raise Conflict(f"{job.handle}: gave up after {CREATE_RETRIES} conflicting placements")


async def _resolve(fut: asyncio.Future, work: Awaitable) -> None:
    """Await `work` and give its result or exception to `fut` (unless its waiter has gone)."""
    try:
        result = await work
    except Exception as e:
        if not fut.done():
            fut.set_exception(e)
    else:
        if not fut.done():
            fut.set_result(result)
