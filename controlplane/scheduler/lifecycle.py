"""The scheduler's histograms (prometheus_client), served at /v1/metrics with the daemon's other
metrics (daemon/metrics.py).

- `twine_submit_to_running_seconds`: from a job's create or update (its record's updated_at) to the
  first pass that finds all of its tasks running at that version.
- `twine_failure_to_replacement_seconds`: from a machine's failure (its failure event's start:
  when it was last heard from) to a task that ran there running on another machine, one
  observation a task; detection (the heartbeat timeout) included.
- `twine_taskcontrol_round_trip_seconds`, by outcome (ok, error): a TaskControl call, sent to answer.
- `twine_allocate_seconds`, by what asked (create; place: tasks of a job that need a machine): the
  allocator's time for one job.

Each lifecycle histogram is observed by the shard leader that saw it happen, from the records it commits, so
a rollout or a failure counts once in the region whatever the number of replicas; a leader that
takes over a job in the middle of a rollout (or that restarts) does not count it (it did not see
it start), rather than count it wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Histogram

from controlplane.store.records import EventRec, JobRec, MachineRec, TaskRec

LIFECYCLE_BUCKETS = (0.5, 1, 2, 3, 4, 5, 7.5, 10, 15, 20, 30, 60, 120, 300)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)
ALLOCATE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


class LifecycleMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # the daemon's registry (tests run several daemons in one process: never the global one)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.submit_to_running = Histogram(
            "twine_submit_to_running_seconds", "A job's create or update to all its tasks running at that version",
            buckets=LIFECYCLE_BUCKETS, registry=self.registry)
        self.failure_to_replacement = Histogram(
            "twine_failure_to_replacement_seconds", "A machine's failure to a task it ran running on another machine",
            buckets=LIFECYCLE_BUCKETS, registry=self.registry)
        self.taskcontrol_round_trip = Histogram(
            "twine_taskcontrol_round_trip_seconds", "A TaskControl call, sent to answered (or failed)",
            ["outcome"], buckets=CALL_BUCKETS, registry=self.registry)
        self.allocate_seconds = Histogram(
            "twine_allocate_seconds", "An allocation, by what asked: a create, or tasks that need a machine (place)",
            ["why"], buckets=ALLOCATE_BUCKETS, registry=self.registry)


class Lifecycle:
    """What one scheduler watches for the two lifecycle histograms, from the records of a job's pass."""

    def __init__(self, metrics: LifecycleMetrics, now: float | None = None) -> None:
        self.metrics = metrics
        # what began before this tracker did (a restart, a shard taken over) is not counted: its
        # start was not seen here, and a rollout or a failure of yesterday would count a day
        self.since = time.time() if now is None else now
        self.rollouts: dict[str, float] = {}  # job -> the updated_at of a rollout seen not yet all running
        self.finished: dict[str, float] = {}  # job -> the updated_at of its last rollout seen all running
        # job -> task index -> (the failed machine, failed at): a job's pass looks at its own only
        self.lost: dict[str, dict[int, tuple[str, float]]] = {}

    def observe(self, job: JobRec, tasks: Mapping[int, TaskRec], machines: Mapping[str, MachineRec],
                open_failures: Callable[[str], list[EventRec]], now: float) -> None:
        """`open_failures(machine)`: its failure events not ended (RegionState.open_failures)."""
        handle = job.handle
        indices = job.indices()
        live = [tasks.get(i) for i in indices]
        since = job.updated_at or job.created_at
        if all(t is not None and t.state == "running" and t.spec_version == job.spec_version for t in live):
            if self.rollouts.pop(handle, None) == since:
                self.metrics.submit_to_running.observe(max(now - since, 0.0))
            self.finished[handle] = since
        elif self.finished.get(handle) != since and since >= self.since:
            self.rollouts[handle] = since  # updated again before it was all running: the new one counts
        lost_of = self.lost.get(handle, {})  # kept below only when it holds a task
        for i, t in zip(indices, live):
            if t is None:
                continue
            lost = lost_of.get(i)
            if lost is not None and t.machine != lost[0] and t.state == "running":
                del lost_of[i]
                self.metrics.failure_to_replacement.observe(max(now - lost[1], 0.0))
            elif lost is not None and t.machine == lost[0] and (m := machines.get(t.machine)) is not None and m.healthy:
                del lost_of[i]  # its machine came back before it moved: no replacement to time
            elif lost is None and t.machine and t.state == "running" and (m := machines.get(t.machine)) is not None \
                    and not m.healthy and (starts := [e.start for e in open_failures(t.machine)]) and (at := max(starts)) >= self.since:
                lost_of[i] = (t.machine, at)
        for i in [i for i in lost_of if not job.live(i)]:
            del lost_of[i]  # scaled down: no replacement comes
        if lost_of:
            self.lost[handle] = lost_of
        else:
            self.lost.pop(handle, None)

    def forget(self, handle: str) -> None:
        """The job is stopped or gone, or another shard schedules it now."""
        self.rollouts.pop(handle, None)
        self.finished.pop(handle, None)
        self.lost.pop(handle, None)

