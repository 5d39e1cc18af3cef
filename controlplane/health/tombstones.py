"""Tombstones: a machine is clean before it is free.

A task moved off a machine the control plane cannot see (unhealthy: silent, cut off, rebooting
past its grace) may still run there: its agent stops the old container only once it is back and
reads its desired state. Until its report shows that container gone, the task stays on the
machine as a tombstone: its resources stay allocated, the machine stays in its entitlement (it
does not return to the free pool, so nobody else is granted it), and it stays unhealthy (nothing
new is placed on it). Kubernetes keeps a pod on an unreachable node Terminating the same way,
until its kubelet confirms the containers gone or an operator force-deletes it.

- The scheduler's transactions add them (scheduler/service.py, Txn): a task that leaves an
  unhealthy machine, moved or stopped, leaves a tombstone there.
- The machine's health owner drops those its agent's report no longer lists, and declares the
  machine healthy only once none are left (health.py).
- An admin who knows the machine wiped, or gone for good, drops them all
  (`POST /v1/machines/{id}/clean`, `twinectl machine clean ID`).
"""

from __future__ import annotations

from typing import Any, Mapping

from controlplane.broker.pool import back_to_pool
from controlplane.store.records import MachineRec

Tombstone = tuple[str, int, float, int, float]  # (job, index, cpus, memory_mb, made: wall-clock seconds)
STALE = "stale tasks"  # the health reason of a machine back with tombstones: it starts so
SHOWN = 5  # tombstones named in a health reason


def reason(rec: MachineRec) -> str:
    """Why a machine with tombstones is not healthy, for people."""
    n = len(rec.tombstones)
    names = ", ".join(f"{t[0]}#{t[1]}" for t in rec.tombstones[:SHOWN]) + (f" and {n - SHOWN} more" if n > SHOWN else "")
    return f"{STALE}: {n} task(s) moved away still have containers here ({names}); its agent is removing them"


def gone(rec: MachineRec, report: Mapping[tuple[str, int], Any] | None, at: float | None) -> tuple[Tombstone, ...]:
    """The machine's tombstones whose containers its agent's report no longer lists. Only a report
    received (`at`, wall-clock) after a tombstone was made speaks for it: a report from before the
    outage says nothing of a container started since. None without a report (a restarted daemon
    has none until the agent resends it)."""
    if report is None or at is None:
        return ()
    return tuple(t for t in rec.tombstones if (t[0], t[1]) not in report and at > t[4])


def drop(rec: MachineRec, dropped: tuple[Tombstone, ...], tasks: int) -> MachineRec:
    """The record without `dropped`, their resources freed; a machine left holding nothing (`tasks`:
    the tasks on it, RegionState.tasks_held) returns to the free pool (broker/pool.py, the
    scheduler's rule too)."""
    if not dropped:
        return rec
    left = list(rec.tombstones)
    for t in dropped:
        left.remove(t)
    m = rec.to_json()
    m["tombstones"] = left
    back_to_pool(m, tasks)
    return MachineRec.from_json(m)
