"""One etcd transaction of a shard's leader: the records a job's task changes write, the guards on
what they were computed from, and per machine the sum of the changes.

The same transaction keeps, per machine, the resources its tasks hold and its entitlement: a free
machine joins the entitlement when a task is placed on it, and returns to the free pool when its
last task leaves (paper Figure 7, broker/pool.py), or to the guaranteed entitlement that reclaimed
it (capacity/reclaim.py); a task leaving an unhealthy machine stays there
as a tombstone until its agent reports its container gone (health/tombstones.py). Discovery
records are written in the transaction that changes the task they describe, so a task is disabled
before its agent can see it stopped or moved.

Every transaction carries two more guards: the leadership's fence (the leader key at its epoch: a
deposed leader commits nothing) and the entitlement's record (a move to another shard rewrites it:
the old owner's next commit fails before it acts on a job it no longer owns).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from controlplane.broker.pool import back_to_pool
from controlplane.capacity.index import heir_of
from controlplane.store import Conflict, Versioned
from controlplane.store.codec import encode
from controlplane.store.keys import Keys
from controlplane.store.records import Endpoint, JobRec, TaskRec
from controlplane.store.state import RegionState

if TYPE_CHECKING:
    from controlplane.coordination.coordinator import Fence

log = logging.getLogger("twine.controld.scheduler")
MAX_TXN_BYTES = 1024 * 1024  # about what one transaction may weigh: etcd's default request limit is 1.5 MiB

Change = tuple[TaskRec | None, TaskRec | None]  # (old, new); new None: the task is deleted


def task_bytes(job: JobRec) -> int:
    """About what one task change of the job weighs in a transaction, at most: its task record
    (which carries the template), its discovery record, its machine's record (written when it
    changes hands), their keys."""
    return 1024 + len(encode(job.task))


class Txn:
    """One etcd transaction of a shard's leader, built from one or more jobs' task changes: the
    records they write, the guards on what they read (the fence, each job, its entitlement, each
    task, each machine whose tasks change), and per machine the tasks it gains or loses, so that
    a machine two jobs of one transaction change is guarded once, and written once when it changes
    hands (taken from the free pool, given back) or gains tombstones."""

    def __init__(self, state: RegionState, keys: Keys, shard: int, owns: Callable[[str], bool],
                 fence: "Fence | None" = None) -> None:
        self.state, self.keys, self.shard, self.owns = state, keys, shard, owns
        self.guards: dict[str, Versioned] = {}
        self.puts: dict[str, Any] = {}  # key -> a record's JSON dict, or the record (encoded as its to_json())
        self.deletes: list[str] = []
        self.delta: dict[str, int] = {}  # machine -> the tasks it gains (fewer: loses)
        self.taken: dict[str, str] = {}  # free machine -> the entitlement it joins
        self.tombstones: dict[str, list[list]] = {}  # unhealthy machine -> tasks that left it (tombstones.py)
        self.entitlements: set[str] = set()  # entitlements whose jobs this transaction changes
        self.jobs: list[str] = []
        self.tasks: list[tuple[str, int]] = []
        self.bytes = 0  # about what the transaction's records weigh (task_bytes a task change)
        if fence is not None:
            self.guards[fence.key] = fence.guard

    @staticmethod
    def size(count: int) -> tuple[int, int]:
        """The most guards and the most writes that a job of `count` task changes adds (etcd
        limits each list of a transaction to max-txn-ops)."""
        return 2 * count + 2, 3 * count + 2

    def fits(self, count: int, limit: int, each: int = 0) -> bool:
        """Whether `count` more task changes of `each` bytes (task_bytes) fit in this transaction."""
        g, w = self.size(count)
        return len(self.guards) + g <= limit and len(self.puts) + len(self.deletes) + w + 1 <= limit \
            and self.bytes + count * each <= MAX_TXN_BYTES

    def add(self, job: JobRec, changes: list[Change], job_put: JobRec | None = None,
            taken: set[str] | frozenset[str] = frozenset(), extra: dict[str, dict] | None = None) -> None:
        keys, st = self.keys, self.state
        if not self.owns(job.handle):
            raise Conflict(f"{job.handle}: its entitlement is no longer in shard {self.shard}")
        jkey, ekey = keys.job(job.handle), keys.entitlement(job.entitlement)
        self.guards[jkey] = st.guard(jkey)
        self.guards[ekey] = st.guard(ekey)
        self.entitlements.add(job.entitlement)
        self.jobs.append(job.handle)
        self.bytes += len(changes) * task_bytes(job)
        self.puts.update(extra or {})
        if job_put is not None:
            self.puts[jkey] = job_put.to_json()
        for mid in taken:
            self.taken.setdefault(mid, job.entitlement)
        handle, guards, puts, delta = job.handle, self.guards, self.puts, self.delta
        for old, new in changes:
            index = (old or new).index
            self.tasks.append((handle, index))
            tkey = keys.task(handle, index)
            guards[tkey] = st.guard(tkey)
            for t, sign in ((old, -1), (new, 1)):
                if t is None:
                    continue
                # its machine, and while it moves (make-before-break) its copy's machine too
                for mid in t.holds():
                    delta[mid] = delta.get(mid, 0) + sign
                    if sign < 0 and (new is None or mid not in new.holds()) and self._unseen(mid):
                        # its container may still run there: the machine keeps it as a tombstone
                        cpus, mem = t.resources
                        self.tombstones.setdefault(mid, []).append([handle, index, cpus, mem, time.time()])
            dkey = keys.endpoint(handle, index)
            if new is None:
                puts.pop(tkey, None)
                self.deletes += [tkey, dkey]
            else:
                # records as they are: the store encodes them (the same JSON as their to_json())
                puts[tkey] = new
                if old is None or (old.machine, old.discovery, old.spec_version) != (new.machine, new.discovery, new.spec_version):
                    m = st.machines.get(new.machine) if new.machine else None
                    puts[dkey] = Endpoint(handle, index, new.machine or "", m.address if m else "",
                                          new.discovery, new.spec_version)

    def _unseen(self, mid: str) -> bool:
        """Whether the machine is one the control plane cannot see now (unhealthy): a task leaving it
        leaves a tombstone. Its record's guard makes the commit fail if that changed meanwhile."""
        m = self.state.machines.get(mid)
        return m is not None and not m.healthy

    def machines(self) -> set[str]:
        return set(self.delta) | set(self.taken) | set(self.tombstones)

    def finish(self) -> tuple[list[Versioned], dict[str, Any], list[str]]:
        """The guards, puts and deletes, with each touched machine's record written once."""
        keys, st = self.keys, self.state
        touched: set[str] = set()
        handed = Counter(self.taken.values())  # what an heir takes from the pool in this transaction counts to its quota
        for mid in self.machines():
            m = st.machines.get(mid)
            if m is None:
                continue  # a machine record that is gone holds nothing
            mkey = keys.machine(mid)
            # Guarded, and written only when what it says changes (its entitlement, its tombstones):
            # what its tasks hold is theirs to say (RegionState.allocated). Two placements on it
            # are ordered all the same: one shard places on it, one commit at a time, each
            # computed from a view that has the one before (Creates._batch, the scheduler's pass).
            self.guards[mkey] = st.guard(mkey)
            new_m: dict | None = None
            if mid in self.tombstones:
                new_m = m.to_json()
                new_m["tombstones"] = [*new_m.get("tombstones", ()), *self.tombstones[mid]]
            if mid in self.taken and m.entitlement is None:
                new_m = new_m or m.to_json()
                new_m["entitlement"] = self.taken[mid]
                touched.add(self.taken[mid])
                log.info("entitlement %s takes machine %s from the free pool", self.taken[mid], mid)
            elif st.tasks_held(mid) + self.delta.get(mid, 0) == 0 and m.entitlement is not None \
                    and (left := back_to_pool(probe := new_m or m.to_json(), 0)) is not None:
                new_m = probe
                touched.add(left)
                if (heir := heir_of(st, mid, left, handed)) is not None:  # reclaimed: it goes to the heir
                    new_m["entitlement"] = heir
                    handed[heir] += 1
                    touched.add(heir)
                    log.info("machine %s goes from %s to %s (reclaim %s)", mid, left, heir, st.reclaims[mid].id)
                else:
                    log.info("machine %s returns from %s to the free pool", mid, left)
            if new_m is not None:
                self.puts[mkey] = new_m
        for name in touched:
            # Every change to what an entitlement holds writes its record: two such changes
            # race on it, so the quota is never overrun by concurrent allocations.
            if name in st.entitlements:
                ekey = keys.entitlement(name)
                self.guards.setdefault(ekey, st.guard(ekey))
                self.puts[ekey] = st.entitlements[name].to_json()
        return list(self.guards.values()), self.puts, self.deletes
