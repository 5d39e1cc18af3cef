"""The daemon's in-memory view of its region: one Index over /twine/<region>/ (a range read, then a
watch), decoded into typed records, plus what is derived from them: the allocator's snapshot, each
machine's desired state, and wake-ups for whoever waits on a change.

One watch for the whole region means one revision: after a commit, `wait_for(revision)` makes the
next read see it (read-your-writes), whichever kinds of record the commit touched.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import sys
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

import msgspec

from controlplane.allocator import Snapshot
from controlplane.capacity.index import Reclaims
from controlplane.opsplanner.maintenance import Calendar
from controlplane.rollouts.record import doc_name, machine_doc
from controlplane.store.records import ON_MACHINE, EntitlementRec, EventRec, JobRec, MachineRec, TaskRec, dec_hook
from controlplane.security.sealing import Sealer
from controlplane.store import Change, Index, Store, Versioned
from controlplane.store.codec import Skipped, decode
from controlplane.store.cells import NOTHING, Cells, Held, holding, micro
from controlplane.store.keys import Keys
from controlplane.store.revisions import Revisions
from controlplane.store.sharing import Shared, share_task
from controlplane.store.allocview import MOVING, AllocatorView
from controlplane.store.wakeups import Wakeups

if TYPE_CHECKING:
    from controlplane.sidekick.documents import ProfileDocuments

log = logging.getLogger("twine.controld.state")
MACHINE_LOG = 10_000  # machines added or removed that RegionState.machines_changed can tell of


def _viewed(m: MachineRec) -> tuple:
    return (m.healthy, m.health_reason, m.profile_applied, m.profile_hash, m.profile_ok, m.profile_error, m.address, m.labels,
            m.capacity, m.entitlement)


# The records every placement writes by the dozen, decoded from etcd's bytes straight into their
# types: one pass, where JSON to a dict and the dict to the record took two (the watch's cost per
# commit). A record of an older shape, which the typed decoder refuses, takes the dict path.
_TYPED = {"machines": (MachineRec, msgspec.json.Decoder(MachineRec, dec_hook=dec_hook)),
          "tasks": (TaskRec, msgspec.json.Decoder(TaskRec))}
# the kinds of key this daemon reads (any other under the region's prefix is left undecoded)
_KEPT = frozenset(("machines", "tasks", "jobs", "entitlements", "events", "leaders", "settings", "members",
                   "ratelimits", "taskcontrol", "tokens", "rebalance", "rebalance-settings", "rollouts", "capacity-settings"))


def decoded(kind: str, raw: bytes) -> Any:
    """A value as etcd has it, for a key of `kind`: the record (machines, tasks), else the JSON
    value. ValueError when it is not JSON (or not the record)."""
    typed = _TYPED.get(kind)
    if typed is not None:
        try:
            return typed[1].decode(raw)
        except msgspec.DecodeError:
            pass  # another shape than this version writes, NaN, or not JSON: read (or refused) as before
    try:
        value = decode(raw)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON: {str(e)[:200]}") from None
    return value if typed is None else typed[0].from_json(value)


class RegionState:
    def __init__(self, store: Store, keys: Keys, profiles: "ProfileDocuments | None" = None):
        self.profiles = profiles  # the sidekick's merged profile documents; None: send names only
        self.sealer = Sealer()  # opens secret values sealed at rest (the daemon's --secret-key-file)
        self.store, self.keys = store, keys
        self.machines: dict[str, MachineRec] = {}
        self.entitlements: dict[str, EntitlementRec] = {}
        self.jobs: dict[str, JobRec] = {}
        self.jobs_by_ent: dict[str, set[str]] = {}
        self._by_ent: defaultdict[str, set[str]] = defaultdict(set)  # entitlement -> its machines' ids
        self.cells = Cells()  # the machines summed per fleet cell, kept as they change (store/cells.py)
        self.machines_version = self.members_version = 0  # bumped: a machine added or removed; a member's change
        # the machines added or removed by the last MACHINE_LOG versions of machines_version, one id
        # each (machines_changed): what changed since a reader last looked, without a set of every
        # machine kept by the reader and built afresh to compare (issue #38: the health check kept
        # one of the million, 42 bytes a machine, and made another at each registration)
        self._machine_log: deque[str] = deque(maxlen=MACHINE_LOG)
        self.on_healthy: list[Callable[[str], None]] = []  # called with a machine's id as its record turns healthy
        self.tasks: dict[str, dict[int, TaskRec]] = defaultdict(dict)
        self.events: dict[str, EventRec] = {}
        self.by_machine: dict[str, set[tuple[str, int]]] = defaultdict(set)
        # machine -> what the tasks it holds (by_machine) hold there: micro-cores, MiB (none: nothing).
        # Summed from the tasks, never written: a placement writes its tasks alone (allocated())
        self.held: dict[str, Held] = {}
        self._unkept = (keys.discovery(),)  # keys this view keeps nothing of (_take)
        self.revs = Revisions(keys.machines(), keys.tasks())  # key -> mod revision, for transaction guards (a machine's by its id, a task's by its job and index)
        # the index reads etcd's bytes (decoded here, by kind) and keeps no copy of revs
        self.index = Index(store, keys.root, on_change=self._on_change, keep_values=False, raw=True, revisions=self.revs,
                           unkept=self._unkept)
        self.credentials: dict[bytes, str] = {}  # the digest of a machine credential (store/digest.py) -> machine id
        self.changed = Wakeups()  # set on every change; each scheduler has its own event
        # coordination (controlplane/coordination/coordinator.py): members and shard leaders, by their leases
        self.members: dict[str, dict] = {}
        self.leaders: dict[int, Versioned] = {}
        self.ratelimits: dict[str, dict] = {}  # persisted token buckets, by scope
        self.taskcontrol: dict[str, dict] = {}  # job -> its TaskController operations in flight
        self.rebalance: dict[str, dict] = {}  # job -> the ReBalancer's move requests and its recent moves
        self.rebalance_settings: dict[str, dict] = {}  # "" -> the continuous mode's settings
        self.rollouts: dict[str, dict] = {}  # entitlement -> its host-profile rollout (controlplane/rollouts)
        self.capacity_settings: dict[str, dict] = {}  # "" -> opportunistic capacity's settings (reclaims paused)
        self.settings: dict = {}
        self.tokens: dict[str, dict] = {}  # API token id -> its record (controlplane/security/tokens.py)
        self.skipped: dict[str, str] = {}  # key -> why its record was not read (reported, skipped)
        # the records kept as etcd has them, by the kind in their key (built once: every change looks here)
        self._plain = {"members": self.members, "ratelimits": self.ratelimits, "taskcontrol": self.taskcontrol,
                       "tokens": self.tokens, "rebalance": self.rebalance, "rebalance-settings": self.rebalance_settings,
                       "rollouts": self.rollouts, "capacity-settings": self.capacity_settings}
        self.coordination_changed = asyncio.Event()
        self._machine_waiters: dict[str, asyncio.Event] = {}
        self.maintenance = Calendar()  # the maintenance events by machine (the ops planner's)
        self._open_failures: dict[str, dict[str, EventRec]] = {}  # machine -> its failure events not ended, by id
        self.reclaims = Reclaims()  # machine -> the open reclaim that covers it (controlplane/capacity)
        self._revision = 0  # the last change's mod revision (_take)
        self._shared = Shared()  # what many machine records have alike, one object each (sharing.py)
        self.alloc = AllocatorView(self)  # the allocator's snapshot of this view (store/allocview.py)

    async def start(self) -> None:
        await self.index.start(each=lambda v: self._take(v.key, v.value, v.mod_revision))
        self.alloc.snap = None
        log.info("region %s: %d machines, %d entitlements, %d jobs, %d tasks at revision %d",
                 self.keys.region, len(self.machines), len(self.entitlements), len(self.jobs),
                 sum(len(t) for t in self.tasks.values()), self.index.revision)

    async def stop(self) -> None:
        await self.index.stop()

    async def wait_for(self, revision: int, timeout: float = 10) -> None:
        await self.index.wait_for(revision, timeout)

    @property
    def revision(self) -> int:
        return self.index.revision

    @property
    def stale(self) -> str:
        """"" while this view follows etcd; else why it may be behind (etcd unreachable, the
        watch being re-established): the API marks its answers with it."""
        return self.store.unavailable or self.index.stale

    async def write(self, guards: list[Versioned], puts: dict[str, Any], deletes: list[str] | tuple = ()) -> int:
        """Commit one guarded transaction and wait until this view has it (read-your-writes)."""
        rev = await self.store.commit(guards, puts, deletes)
        await self.wait_for(rev)
        return rev

    def guard(self, key: str) -> Versioned:
        """A transaction guard: `key` must still be at the revision this view has (0: absent)."""
        return Versioned(key, None, self.revs.get(key, 0))

    # -- decoding the watch ----------------------------------------------------------------

    def _on_change(self, change: Change) -> None:
        self.changed.set(self._take(change.key, change.value, change.mod_revision))

    def _take(self, key: str, value, revision: int) -> set[str] | None:
        """_apply, except that a record this daemon cannot read (too large, not JSON, not the
        record its key says) is reported and skipped: the view keeps what it had. Such a record
        must neither stop the watch nor the daemon's next start (issue #11)."""
        if key.startswith(self._unkept):
            # written for discovery's clients, which read etcd; this view keeps none of them, nor
            # their revisions (nothing guards them), readable or not: one a task, in every process
            # (issue #38). GET /v1/discovery says them from the tasks.
            return set()
        if revision == self._revision:
            revision = self._revision  # one int for a commit's keys (72 of a 36-task job), not one a key
        else:
            self._revision = revision
        if isinstance(value, Skipped):
            return self._skip(key, value.why, revision)
        try:
            return self._apply(key, value, revision)
        except (TypeError, KeyError, ValueError, AttributeError) as e:  # msgspec's ValidationError is a ValueError
            return self._skip(key, f"{type(e).__name__}: {str(e)[:300]}", revision)

    def _skip(self, key: str, why: str, revision: int) -> set[str]:
        if self.skipped.get(key) != why:
            log.error("skipping the record %s, which this daemon cannot read (%s); it keeps what it had. "
                      "Rewrite or delete the record to end this", key, why)
        self.skipped[key] = why
        if key.startswith(self.revs.prefix):  # a machine's: its revision changes below
            self.alloc.changing(key[len(self.revs.prefix):])
        # Its guards compare etcd's revision, whatever the kind: a commit made from what this
        # view last could read replaces the unreadable record (at the old revision, every commit
        # touching it would conflict, and the scheduler retry it without end). Kept as a key,
        # too, so that the index's fresh read after an outage hands on its deletion (the index
        # keeps no revisions of its own: Index(revisions=)).
        self.revs[key] = revision
        return set()

    def machines_changed(self, since: int) -> set[str] | None:
        """The machines added or removed since machines_version was `since` (each either; which:
        whether it is in `machines` now), or None when the log no longer reaches back that far."""
        behind = self.machines_version - since
        if behind < 0 or behind > len(self._machine_log):
            return None
        return set(itertools.islice(reversed(self._machine_log), behind))

    def jobs_on(self, mid: str) -> set[str]:
        return {h for h, _ in self.by_machine.get(mid, ())}

    def _apply(self, key: str, value: dict | None, revision: int) -> set[str] | None:
        """Decode one change into the view. Returns the jobs it may concern, for the schedulers'
        work queues (None: any job)."""
        kind, _, rest = key[len(self.keys.root):].partition("/")
        if kind == "machines":
            self.alloc.changing(rest)  # (before its revision changes, just below)
        if isinstance(value, bytes) and kind in _KEPT:  # as etcd has it (the index reads raw)
            value = decoded(kind, value)
        if self.skipped:
            self.skipped.pop(key, None)
        if value is None:
            self.revs.pop(key, None)
        elif not (kind == "machines" and isinstance(value, MachineRec) and value.id == rest):
            self.revs[key] = revision  # (a machine's is kept under the id its record holds: _set_machine)
        # the kinds every placement writes by the dozen first
        if kind == "tasks":
            handle, _, idx = rest.rpartition("/")
            handle = sys.intern(handle)  # one string a job: its tasks dict's key, each task's, the sets' keys
            self._set_task(handle, int(idx), value)
            return {handle}
        plain = self._plain.get(kind)
        if plain is not None:  # kept as etcd has them
            if value is None:
                plain.pop(rest, None)
            else:
                plain[rest] = value
            if kind == "members":
                self.members_version += 1
                self.coordination_changed.set()
            if kind == "capacity-settings":  # the reserve opportunistic entitlements leave free: in their snapshot
                self.alloc.ents.update(n for n, e in self.entitlements.items() if e.kind == "opportunistic")
            if kind == "rollouts":  # which profile each machine should hold, and which must stop its tasks
                self._wake_entitlement(rest, None)
                return set(self.jobs_by_ent.get(rest, ()))
            return {rest} if kind == "rebalance" else set()
        if kind == "machines":
            viewed = self._set_machine(rest, value, revision)  # decoded into its record (as etcd's bytes are)
            return self.jobs_on(rest) if viewed else set()
        if kind == "entitlements":
            old = self.entitlements.get(rest)
            if value is None:
                self.entitlements.pop(rest, None)
            else:
                self.entitlements[rest] = EntitlementRec.from_json(value)
            self.alloc.ents.add(rest)
            self._wake_entitlement(rest, old)
            return set(self.jobs_by_ent.get(rest, ()))
        if kind == "jobs":
            if value is None:
                old_job = self.jobs.pop(rest, None)
                if old_job is not None:
                    self.jobs_by_ent.get(old_job.entitlement, set()).discard(rest)
            else:
                self.jobs[rest] = job = JobRec.from_json(value)
                self.jobs_by_ent.setdefault(job.entitlement, set()).add(rest)
            return {rest}
        if kind == "events":
            new = None if value is None else EventRec.from_json(value)  # first: one it cannot read changes nothing
            old = self.events.pop(rest, None)
            if new is not None:
                self.events[rest] = new
            for e, is_new in ((old, False), (self.events.get(rest), True)):
                if e is not None and e.kind == "failure":
                    for mid in e.machines:
                        open_ = self._open_failures.setdefault(mid, {})
                        if is_new and e.end is None:
                            open_[e.id] = e
                        else:
                            open_.pop(e.id, None)
                        if not open_:
                            del self._open_failures[mid]
            if any(e is not None and e.kind == "maintenance" for e in (old, self.events.get(rest))):
                self.maintenance.index(self.events.values())
                return None  # a maintenance scheduled, changed or ended: its notices go to any job
            if self.reclaims.take(old, self.events.get(rest)):
                return None  # a reclaim begun or over: its notices, and the heir's jobs, which wait for its machines
            e = self.events.get(rest) or old  # a failure: the jobs on its machines
            return set().union(*(self.jobs_on(mid) for mid in e.machines)) if e is not None else set()
        if kind == "leaders":
            if value is None:
                self.leaders.pop(int(rest), None)
            else:
                self.leaders[int(rest)] = Versioned(key, value, revision)
            self.coordination_changed.set()
        elif kind == "settings":
            self.settings = value or {}
        return set()

    def _set_machine(self, mid: str, m: MachineRec | None, revision: int) -> bool:
        """Returns whether what the scheduler sees of the machine changed (MachineStatus: not its
        agent's version, its registration, its credential, its tombstones)."""
        old = self.machines.get(mid)
        if m is not None:
            if m.id == mid:  # one id string a machine: its records', its revision's, the dict's key (the first kept)
                if old is not None and old.id == mid:
                    object.__setattr__(m, "id", old.id)
                mid = m.id
                self.revs.machines[mid] = revision
            self._shared.machine(m, old)
        self.cells.change(old, m, self.held.get(mid, NOTHING))
        if old is not None and old.credential_sha256:
            self.credentials.pop(old.credential_sha256, None)
        if old is not None and old.entitlement and (m is None or m.entitlement != old.entitlement):
            self._by_ent[old.entitlement].discard(mid)  # (an empty set stays: one per entitlement seen)
        if m is None:
            self.machines.pop(mid, None)
        else:
            self.machines[mid] = m
            if m.credential_sha256:
                self.credentials[m.credential_sha256] = mid
            if m.entitlement:
                self._by_ent[m.entitlement].add(mid)
        if m is not None and m.healthy and (old is None or not old.healthy):
            for hook in self.on_healthy:
                hook(mid)
        if (old is None) != (m is None):
            self.machines_version += 1  # the set of machines changed
            self._machine_log.append(mid)  # (the version it made: machines_version when appended)
        self.wake_machine(mid)
        return old is None or m is None or _viewed(old) != _viewed(m)

    def _set_task(self, handle: str, index: int, t: TaskRec | None) -> None:
        old = self.tasks.get(handle, {}).get(index)
        if t is None:
            self.tasks.get(handle, {}).pop(index, None)
            if handle in self.tasks and not self.tasks[handle]:
                del self.tasks[handle]
        else:
            # one copy of a job's task template, not one per task (fewer objects for the
            # collector's full passes to scan): the task's own record is fresh, not yet shared
            shared = old.spec if old is not None and old.spec_version == t.spec_version else None
            if shared is None and (job := self.jobs.get(handle)) is not None and job.spec_version == t.spec_version:
                shared = job.task
            if shared is not None and shared is not t.spec and shared == t.spec:
                object.__setattr__(t, "spec", shared)
            share_task(t, handle, self.machines)
            self.tasks[handle][index] = t
        key = (handle, index)
        before = old.holds() if old is not None else ()
        after = t.holds() if t is not None else ()
        same = before == after and old is not None and t is not None and (old.spec is t.spec or old.resources == t.resources)
        for mid in before:
            self.by_machine[mid].discard(key)
            if not same:
                self._hold(mid, old, -1)
        for mid in after:
            self.by_machine[mid].add(key)
            if not same:
                self._hold(mid, t, 1)
        self.alloc.tasks.add(key)
        if (old is not None and old.moving is not None) or (t is not None and t.moving is not None):
            self.alloc.tasks.add((handle + MOVING, index))
        for m in set(before) | set(after):
            self.wake_machine(m)

    def _hold(self, mid: str, t: TaskRec, k: int) -> None:
        """Task `t` comes to (k=1) or leaves (k=-1) what machine `mid` holds (by_machine, already)."""
        was = self.held.get(mid, NOTHING)
        cpus, mem = t.resources
        now = (was[0] + k * micro(cpus), was[1] + k * mem)
        if self.by_machine.get(mid):
            self.held[mid] = now
        else:
            self.held.pop(mid, None)
            del self.by_machine[mid]  # (no set kept a machine that holds nothing)
        m = self.machines.get(mid)
        if m is not None:
            self.cells.hold(m, was, now if mid in self.held else NOTHING)

    def allocated(self, mid: str) -> tuple[int, float, int]:
        """What machine `mid` holds: tasks, cpus, MiB; its tasks' and its tombstones' (their
        containers may still run there: tombstones.py)."""
        held = self.held.get(mid, NOTHING)
        m = self.machines.get(mid)
        stones = m.tombstones if m is not None else ()
        cpu_u, mb = holding(m, held) if stones else held
        return self.tasks_held(mid) + len(stones), round(cpu_u / 1_000_000, 6), mb

    def tasks_held(self, mid: str) -> int:
        """How many tasks machine `mid` holds (its tombstones not counted)."""
        return len(self.by_machine.get(mid, ()))

    def _wake_entitlement(self, name: str, old: EntitlementRec | None) -> None:
        new = self.entitlements.get(name)
        if old is None or new is None or old.profile != new.profile:
            for m in self.machines_of(name):
                self.wake_machine(m.id)

    def open_failures(self, mid: str) -> list[EventRec]:
        """The machine's failure events not ended (an index: no pass over every event)."""
        return list(self._open_failures.get(mid, {}).values())

    # -- shards -------------------------------------------------------------------------------

    @property
    def shard_count(self) -> int:
        return int(self.settings.get("shards", 1))

    def shard_of_job(self, handle: str) -> int | None:
        job = self.jobs.get(handle)
        ent = self.entitlements.get(job.entitlement if job else handle.partition("/")[0])
        return None if ent is None else ent.shard

    # -- long-poll wake-ups ----------------------------------------------------------------

    def wake_machine(self, mid: str) -> None:
        ev = self._machine_waiters.pop(mid, None)
        if ev is not None:
            ev.set()

    def machine_changed(self, mid: str) -> asyncio.Event:
        """An event set at the next change that may touch the machine's desired state."""
        return self._machine_waiters.setdefault(mid, asyncio.Event())

    # -- derived views ---------------------------------------------------------------------

    def desired_document(self, m: MachineRec, joining: str | None = None) -> tuple[str | None, dict | None]:
        """The sidekick's rule: a machine in an entitlement wants the entitlement's profile, as its
        rollout says (a machine not switched yet keeps the old one); a free machine wants none (its
        originals restored). `joining`: the entitlement a free machine is about to join (a
        placement that takes it from the free pool). (name, its document or None: names only)."""
        name = m.entitlement or joining
        ent = self.entitlements.get(name) if name else None
        if ent is not None and (r := self.rollouts.get(name)) is not None:
            doc = machine_doc(r, m.id)
            return doc_name(doc), doc if doc is not None and doc.get("sections") is not None else None
        profile = ent.profile if ent else None
        return profile, self.profiles.document(profile) if profile and self.profiles is not None else None

    def desired_profile(self, m: MachineRec, joining: str | None = None) -> str | None:
        return self.desired_document(m, joining)[0]

    def profile_ready(self, m: MachineRec, joining: str | None = None) -> bool:
        name, doc = self.desired_document(m, joining)
        return m.profile_ok and m.profile_applied == name and (doc is None or m.profile_hash in (None, doc["hash"]))

    def machines_of(self, entitlement: str) -> list[MachineRec]:
        """The entitlement's machines, by id (an index: no pass over the region's machines)."""
        return [self.machines[mid] for mid in sorted(self._by_ent.get(entitlement, ()))]

    def tasks_on(self, mid: str) -> list[TaskRec]:
        return [self.tasks[job][i] for job, i in sorted(self.by_machine.get(mid, ()))]

    def desired_for(self, mid: str, open_secrets: bool = True) -> dict:
        """The machine's desired state as the agent reads it, with a version that is a hash of
        its content: a restarted daemon computes the same version, so no agent restarts a task.
        SealingError when a secret value does not open here (the agent is answered 503 and keeps
        what runs: a task never runs without its secret, nor is stopped for this replica's key)."""
        m = self.machines[mid]
        # its tasks, and the copies starting here of tasks moving here (make-before-break)
        # (a copy waits for the machine's profile, as a task placed there does: a swap takes a free machine)
        ready = self.profile_ready(m)
        tasks = sorted((t for t in self.tasks_on(mid) if (t.machine == mid and t.state in ON_MACHINE)
                        or (ready and t.moving is not None and t.moving.machine == mid)), key=lambda t: (t.job, t.index))
        name, doc = self.desired_document(m)
        # the version is a hash of the tasks as etcd holds them (secret values sealed): it tells
        # nothing of a secret; the agent's copy has them opened (SealingError: one does not open)
        body = {"profile": name, "tasks": [t.agent_spec() for t in tasks]}
        if doc is not None:
            body["profile_spec"] = doc
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]
        if open_secrets and any("secret_env" in t.spec for t in tasks):
            body["tasks"] = [t.agent_spec(self.sealer.open_task) for t in tasks]
        return {**body, "version": digest}

    @property
    def reserve(self) -> int:
        """Free machines per machine type and dc that opportunistic entitlements leave free
        (`twinectl capacity reserve`; 0: none)."""
        return int(self.capacity_settings.get("", {}).get("reserve", 0))

    def snapshot(self) -> Snapshot:
        """The allocator's snapshot, moved forward in place by the changes since the last call:
        the same object every time, at a cost that follows the changes, not the region. Use it
        before your next await (allocate() is synchronous) and do not keep it: the next call
        changes it. Its machines are read off their records when asked (store/allocview.py)."""
        return self.alloc.snapshot()

    def reread(self, machines: Iterable[str], tasks: Iterable[tuple[str, int]]) -> None:
        """The snapshot takes these machines and tasks from their records again at the next
        snapshot(): after a change made to it ahead of a commit that did not land."""
        self.alloc.reread(machines, tasks)
