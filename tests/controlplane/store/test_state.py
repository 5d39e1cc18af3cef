"""RegionState's allocator snapshot, fed record by record as the etcd watch feeds it: moved forward in
place, it stays what a snapshot built from scratch out of the same records would be."""

from __future__ import annotations

import gc
import random
import time
from dataclasses import replace

import pytest

from controlplane.allocator import Machine, allocate
from controlplane.allocator.errors import AllocationError
from controlplane.store.records import EntitlementRec, EventRec, MachineRec, Spread, TaskRec
from controlplane.store.allocview import RECENT
from controlplane.store.state import RegionState, decoded
from controlplane.store.codec import Skipped, encode
from controlplane.store.keys import Keys

from tests.controlplane.allocator.builders import job
from tests.controlplane.allocator.test_snapshot import index_state

KEYS = Keys("r")


def machine(rnd: random.Random, mid: str) -> MachineRec:
    labels = {"region": "r", "dc": rnd.choice(["dc0", "dc1"]), "msb": f"b{rnd.randrange(3)}",
              "rack": f"k{rnd.randrange(3)}", "machine_type": rnd.choice(["sky", "sky", "old"])}
    return MachineRec(mid, mid, labels, {"cpus": rnd.choice([4, 8]), "memory_mb": 8192},
                      entitlement=rnd.choice([None, None, "ent", "b"]), healthy=rnd.random() > 0.1)


def task(rnd: random.Random, machines: list[str]) -> TaskRec:
    return TaskRec(f"{rnd.choice(['ent', 'b'])}/j{rnd.randrange(3)}", rnd.randrange(5), 1,
                   {"cpus": rnd.choice([0.5, 1, 2]), "memory_mb": 256}, rnd.choice(machines + [None]), "running")


def entitlement(rnd: random.Random, name: str) -> EntitlementRec:
    return EntitlementRec(name, "sky", rnd.randrange(3, 30), spread=Spread(("dc", "msb"), rnd.choice([None, "dc1"])))


def fresh(state: RegionState) -> RegionState:
    """A daemon that just started: the same records, its snapshot built from them."""
    other = RegionState(None, KEYS)
    for key, rev in state.revs.items():
        kind, _, rest = key[len(KEYS.root):].partition("/")
        if kind == "machines":
            value = state.machines[rest].to_json()
        elif kind == "entitlements":
            value = state.entitlements[rest].to_json()
        elif kind == "tasks":
            handle, _, idx = rest.rpartition("/")
            value = state.tasks[handle][int(idx)].to_json()
        else:
            value = state.events[rest].to_json()
        other._apply(key, encode(value), rev)  # noqa: SLF001 - the watch's own path, with etcd's bytes
    other.index.revision = state.index.revision
    return other


def test_snapshot_follows_the_watch_in_place_and_matches_a_fresh_build():
    rnd = random.Random(3)
    state = RegionState(None, KEYS)
    rev = 0

    def put(key: str, value: dict | None) -> None:
        nonlocal rev
        rev += 1
        state._apply(key, None if value is None else encode(value), rev)  # noqa: SLF001 - as the watch hands it
        state.index.revision = rev

    for n in range(20):
        put(KEYS.machine(f"m{n:02d}"), machine(rnd, f"m{n:02d}").to_json())
    for name in ("ent", "b"):
        put(KEYS.entitlement(name), entitlement(rnd, name).to_json())
    first = state.snapshot()
    now = time.time()
    for step in range(60):
        ids = sorted(state.machines)
        for _ in range(rnd.randrange(1, 6)):
            what = rnd.random()
            if what < 0.3:
                mid = rnd.choice(ids + [f"m{rnd.randrange(20, 30)}"])
                put(KEYS.machine(mid), machine(rnd, mid).to_json())
            elif what < 0.4 and len(ids) > 5:
                put(KEYS.machine(rnd.choice(ids)), None)
            elif what < 0.75:
                t = task(rnd, ids)
                put(KEYS.task(t.job, t.index), t.to_json())
            elif what < 0.85 and state.tasks:
                handle = rnd.choice(sorted(state.tasks))
                put(KEYS.task(handle, rnd.choice(sorted(state.tasks[handle]))), None)
            elif what < 0.95:
                name = rnd.choice(["ent", "b", "c"])
                put(KEYS.entitlement(name), None if rnd.random() < 0.2 else entitlement(rnd, name).to_json())
            else:
                e = EventRec("maint-1", "maintenance", tuple(rnd.sample(ids, 2)), now - 10, duration=3600.0)
                put(KEYS.event(e.id), e.to_json() if rnd.random() < 0.7 else None)
        snap = state.snapshot()
        assert snap is first, "moved forward in place, not rebuilt"
        want = fresh(state).snapshot()
        assert snap.revision == want.revision == rev
        assert index_state(snap) == index_state(want), f"step {step}"
        assert dict(snap.machines) == dict(want.machines) and dict(snap.entitlements) == dict(want.entitlements)
        assert dict(snap._used) == dict(want._used)  # noqa: SLF001
        for name in ("ent", "b", "c"):  # the index of an entitlement's machines, against a pass over them all
            assert [m.id for m in state.machines_of(name)] == sorted(
                m.id for m in state.machines.values() if m.entitlement == name), (step, name)
        if "ent" in snap.entitlements:
            request = job(f"ent/j{rnd.randrange(3)}", rnd.randrange(1, 6), cpus=1.0, memory_mb=256)
            got = [None, None]
            for i, s in enumerate((snap, want)):
                try:
                    got[i] = allocate(s, request)
                except AllocationError as e:
                    got[i] = str(e)
            assert got[0] == got[1], step


def test_the_snapshot_keeps_no_object_a_machine_and_a_placement_applied_ahead_of_its_commit_holds_until_its_records_come():
    rnd = random.Random(5)
    state = RegionState(None, KEYS)
    rev = 0

    def put(key: str, value: dict | None) -> None:
        nonlocal rev
        rev += 1
        state._apply(key, None if value is None else encode(value), rev)  # noqa: SLF001 - as the watch hands it
        state.index.revision = rev

    for n in range(3000):
        m = replace(machine(rnd, f"m{n:04d}"), entitlement=None)  # all free: a placement takes some
        put(KEYS.machine(m.id), m.to_json())
    put(KEYS.entitlement("ent"), EntitlementRec("ent", "sky", 3000).to_json())
    snap = state.snapshot()
    gc.unfreeze()  # (the snapshot's first build froze what the region held: get_objects sees no frozen object)
    gc.collect()
    # the allocator's Machine made of each record when read, and only the last RECENT kept: 3000 before (issue #38)
    assert RECENT < 3000 and sum(isinstance(o, Machine) for o in gc.get_objects()) <= RECENT + 10
    assert len(snap.machines) == 3000 and snap.machines["m0007"].id == "m0007"

    def check(step: str) -> None:
        want = fresh(state).snapshot()
        assert index_state(state.snapshot()) == index_state(want), step
        assert dict(snap.machines) == dict(want.machines), step

    # a batch of creates applies a placement to the snapshot ahead of its commit: the next create sees it
    placement = allocate(snap, job("ent/a", 6, cpus=1.0, memory_mb=256))
    snap.apply_placement(placement)
    taken = set(placement.machines_taken)
    assert taken and all(snap.machines[mid].entitlement == "ent" for mid in taken)
    assert all(state.machines[mid].entitlement is None for mid in taken)  # (the records are not yet)
    state.snapshot()  # no record came: still as applied
    assert all(snap.machines[mid].entitlement == "ent" for mid in taken)
    # the commit did not land: read from the records again
    state.reread(placement.task_machines, [("ent/a", i) for i in range(6)])
    check("after a reread")
    assert all(snap.machines[mid].entitlement is None for mid in taken)
    # it landed: its records come through the watch, the tasks first
    placement = allocate(snap, job("ent/b", 6, cpus=1.0, memory_mb=256))
    snap.apply_placement(placement)
    for i, mid in enumerate(placement.task_machines):
        put(KEYS.task("ent/b", i), TaskRec("ent/b", i, 1, {"cpus": 1.0, "memory_mb": 256}, mid, "running").to_json())
    for mid in set(placement.task_machines):
        put(KEYS.machine(mid), replace(state.machines[mid], entitlement="ent").to_json())
    check("after the commit")
    assert all(snap.machines[mid].entitlement == "ent" and snap.machines[mid].version == state.revs.machines[mid]
               for mid in placement.task_machines)


def test_a_machine_kept_for_the_next_read_follows_its_record_its_cordon_and_a_record_skipped():
    state = RegionState(None, KEYS)
    rev = 0

    def put(key: str, value) -> None:
        nonlocal rev
        rev += 1
        state._take(key, value if isinstance(value, Skipped) else encode(value), rev)  # noqa: SLF001
        state.index.revision = rev

    rnd = random.Random(3)
    for mid in ("a", "b", "c"):
        put(KEYS.machine(mid), replace(machine(rnd, mid), healthy=True).to_json())
    snap = state.snapshot()
    a = snap.machines["a"]
    assert snap.machines["a"] is a, "kept for the next read"
    put(KEYS.machine("a"), replace(state.machines["a"], healthy=False).to_json())
    assert state.snapshot().machines["a"].healthy is False and snap.machines["a"].version == rev
    assert not snap.machines["b"].cordoned
    put(KEYS.event("mt"), EventRec("mt", "maintenance", ("b",), time.time() - 1, duration=600.0).to_json())
    assert state.snapshot().machines["b"].cordoned
    c = snap.machines["c"]  # kept now, at the revision of its record
    assert snap.machines["c"] is c and c.version == state.revs.machines["c"] < rev
    put(KEYS.machine("c"), Skipped("larger than 2 MiB"))
    assert snap.machines["c"].version == rev == state.revs.machines["c"]


def test_open_failures_follow_the_events_as_they_open_end_and_go():
    """The index behind the health check's and the histograms' "open failure events of this
    machine" (no pass over every event, which are kept): kept by the watch's own path."""
    state = RegionState(None, KEYS)
    f1 = EventRec("f1", "failure", ("a",), 10.0, "no heartbeat")
    f2 = EventRec("f2", "failure", ("a", "b"), 11.0, "no heartbeat")
    maint = EventRec("mt", "maintenance", ("a",), 12.0, duration=60.0)
    for rev, e in enumerate((f1, f2, maint), start=1):
        state._apply(KEYS.event(e.id), e.to_json(), rev)  # noqa: SLF001 - the watch's own path
    assert sorted(e.id for e in state.open_failures("a")) == ["f1", "f2"]
    assert [e.id for e in state.open_failures("b")] == ["f2"]
    state._apply(KEYS.event("f2"), replace(f2, end=20.0).to_json(), 4)  # noqa: SLF001
    assert [e.id for e in state.open_failures("a")] == ["f1"] and state.open_failures("b") == []
    state._apply(KEYS.event("f1"), None, 5)  # noqa: SLF001 - deleted
    assert state.open_failures("a") == [] and state.open_failures("c") == []


def test_records_are_decoded_from_etcds_bytes_into_their_types_and_older_shapes_still_read():
    rnd = random.Random(5)
    m = replace(machine(rnd, "m1"), tombstones=(("e/j", 1, 0.5, 64, 3.0),))
    t = task(rnd, ["m1"])
    assert decoded("machines", encode(m.to_json())) == m
    assert decoded("tasks", encode(t.to_json())) == t
    # written before tombstones carried when they were made: the typed decoder refuses it, the
    # record's own reader takes it (made at 0)
    old = {**m.to_json(), "tombstones": [["e/j", 1, 0.5, 64]]}
    assert decoded("machines", encode(old)).tombstones == (("e/j", 1, 0.5, 64, 0.0),)
    # a field of another type than this version writes: taken as it is, as before
    assert decoded("tasks", encode({**t.to_json(), "index": "3"})).index == "3"
    assert decoded("jobs", b'{"a": [1]}') == {"a": [1]}  # other kinds: their JSON, for their from_json
    with pytest.raises(ValueError, match="not JSON"):
        decoded("tasks", b"\x00 not json")


def test_a_record_that_is_not_json_is_skipped_and_the_view_keeps_what_it_had():
    state = RegionState(None, KEYS)
    rnd = random.Random(6)
    m = machine(rnd, "m1")
    state._take(KEYS.machine("m1"), encode(m.to_json()), 1)  # noqa: SLF001 - the watch's own path
    state._take(KEYS.machine("m1"), b"{not json", 2)  # noqa: SLF001
    assert state.machines["m1"] == m
    assert state.skipped[KEYS.machine("m1")].startswith("ValueError: not JSON")
    # guards compare etcd's revision, whatever the kind: a commit from the view replaces the
    # unreadable record rather than conflicting with it for ever
    assert state.revs[KEYS.machine("m1")] == 2
    state._take(KEYS.job("e/odd"), b'{"entitlement": "e"}', 3)  # noqa: SLF001 - JSON, not a job record
    assert KEYS.job("e/odd") in state.skipped and state.revs[KEYS.job("e/odd")] == 3
    state._take(KEYS.root + "other/x", b"{not json either", 3)  # noqa: SLF001 - no kind it keeps: not read
    assert KEYS.root + "other/x" not in state.skipped


def test_machines_of_a_rack_share_one_labels_dict_and_a_type_one_capacity_dict():
    """A million machines' records fit in memory because a rack's machines hold one labels dict
    and a machine type's one capacity dict (each machine had its own: ~700 B of its ~1.7 KB)."""
    state = RegionState(None, KEYS)
    labels = {"region": "r", "dc": "dc0", "msb": "b0", "rack": "k0", "machine_type": "sky"}
    for rev, mid in enumerate(("m1", "m2", "m3"), start=1):
        lb = {**labels, "rack": "k1"} if mid == "m3" else labels
        rec = MachineRec(mid, mid, lb, {"cpus": 8, "memory_mb": 8192})
        state._take(KEYS.machine(mid), encode(rec.to_json()), rev)  # noqa: SLF001 - the watch's own path
    m1, m2, m3 = (state.machines[m] for m in ("m1", "m2", "m3"))
    assert m1.labels is m2.labels and m1.labels == labels and m3.labels["rack"] == "k1"
    assert m1.capacity is m2.capacity is m3.capacity
    # a record with a value that cannot be a key is kept as it is, not skipped
    odd = MachineRec("m4", "m4", {**labels, "extra": ["a"]}, {"cpus": 8, "memory_mb": 8192})
    state._take(KEYS.machine("m4"), encode(odd.to_json()), 4)  # noqa: SLF001
    assert state.machines["m4"].labels["extra"] == ["a"] and not state.skipped


def test_a_machine_rewritten_takes_what_is_unchanged_from_the_record_it_replaces():
    """A machine's record rewritten (its health, its agent's address): the rest is taken from the
    record replaced (compared, not hashed again), and what changed is its own value."""
    state = RegionState(None, KEYS)
    labels = {"region": "r", "dc": "dc0", "msb": "b0", "rack": "k0", "machine_type": "sky"}
    rec = MachineRec("m1", "m1", labels, {"cpus": 8, "memory_mb": 8192}, agent_version="1.2", profile_hash="h" * 40)
    state._take(KEYS.machine("m1"), encode(rec.to_json()), 1)  # noqa: SLF001 - the watch's own path
    before = state.machines["m1"]
    state._take(KEYS.machine("m1"), encode(replace(rec, healthy=False, address="10.0.0.9:1").to_json()), 2)  # noqa: SLF001
    after = state.machines["m1"]
    assert after.labels is before.labels and after.capacity is before.capacity
    assert after.profile_hash is before.profile_hash and after.agent_version is before.agent_version
    assert (after.healthy, after.address) == (False, "10.0.0.9:1")
    state._take(KEYS.machine("m1"), encode(replace(rec, labels={**labels, "rack": "k1"}).to_json()), 3)  # noqa: SLF001
    assert state.machines["m1"].labels == {**labels, "rack": "k1"} and before.labels["rack"] == "k0"


def test_a_machines_id_is_one_string_for_its_records_its_dict_key_and_its_revision():
    """At a million machines, each copy of an id was ~57 bytes and each machine's whole key ~80, in
    every process (issue #38): the view keeps one string per machine, across its updates, and its
    revision under it. Guards and the index still read whole keys."""
    state = RegionState(None, KEYS)
    labels = {"region": "r", "dc": "dc0", "msb": "b0", "rack": "k0", "machine_type": "sky"}
    rec = MachineRec("m1", "m1", labels, {"cpus": 8, "memory_mb": 8192})
    key = "".join([KEYS.machines(), "m", "1"])  # a fresh string each time, as etcd's decoder makes
    state._take(key, encode(rec.to_json()), 5)  # noqa: SLF001 - the watch's own path
    first = state.machines["m1"]
    state._take("".join([KEYS.machines(), "m1"]), encode(replace(rec, healthy=False).to_json()), 9)  # noqa: SLF001
    now = state.machines["m1"]
    assert now.healthy is False and now is not first
    (dict_key,) = state.machines
    (rev_key,) = state.revs.machines
    assert now.id is first.id is dict_key is rev_key is now.hostname
    assert state.revs[KEYS.machine("m1")] == 9 == state.guard(KEYS.machine("m1")).mod_revision
    assert dict(state.revs.items()) == {KEYS.machine("m1"): 9} and KEYS.machine("m1") in state.revs
    state._take(KEYS.entitlement("e"), encode({"name": "e", "machine_type": "sky", "quota": 1}), 10)  # noqa: SLF001
    assert sorted(state.revs) == [KEYS.entitlement("e"), KEYS.machine("m1")] and len(state.revs) == 2
    assert state.snapshot().machines["m1"].version == 9
    state._take(KEYS.machine("m1"), None, 11)  # noqa: SLF001 - deleted
    assert KEYS.machine("m1") not in state.revs and state.guard(KEYS.machine("m1")).mod_revision == 0
    assert "m1" not in state.snapshot().machines


def test_a_task_shares_its_jobs_handle_its_machines_id_and_its_state_and_discovery_records_are_not_kept():
    """Each decoded task held its own copies of its job's handle, its machine's id and its state
    (170 of its 320 bytes), and each task's discovery record was kept decoded with its revision
    (about 600 bytes more), in every process (issue #38). Guards on tasks are unchanged."""
    state = RegionState(None, KEYS)
    labels = {"region": "r", "dc": "dc0", "msb": "b0", "rack": "k0", "machine_type": "sky"}
    state._take(KEYS.machine("m1"), encode(MachineRec("m1", "m1", labels, {"cpus": 8, "memory_mb": 8192}).to_json()), 1)  # noqa: SLF001
    for i, rev in ((0, 2), (1, 3)):
        t = TaskRec("".join(["web/", "api"]), i, 1, {"cpus": 1, "memory_mb": 256}, "".join(["m", "1"]), "".join(["run", "ning"]))
        # the key's handle and the record's strings are fresh, as etcd's decoder makes them
        state._take("".join([KEYS.tasks("web/api"), f"{i:06d}"]), encode(t.to_json()), rev)  # noqa: SLF001
        endpoint = {"job": "web/api", "index": i, "machine": "m1", "address": "10.0.0.1", "enabled": True, "spec_version": 1}
        state._take(KEYS.endpoint("web/api", i), encode(endpoint), rev)  # noqa: SLF001
    (handle,) = state.tasks
    a, b = state.tasks["web/api"][0], state.tasks["web/api"][1]
    (mid,) = state.machines
    assert a.job is b.job is handle and a.machine is b.machine is mid is state.machines["m1"].id
    assert a.state is b.state == "running"
    assert {k for (k, _) in state.by_machine["m1"]} == {"web/api"} and all(h is handle for h, _ in state.by_machine["m1"])
    assert sorted(state.revs) == [KEYS.machine("m1"), KEYS.task("web/api", 0), KEYS.task("web/api", 1)]
    assert state.guard(KEYS.task("web/api", 1)).mod_revision == 3 and not state.skipped
    state._take(KEYS.endpoint("web/api", 0), None, 4)  # noqa: SLF001 - a deletion: nothing to forget
    state._take(KEYS.endpoint("web/api", 1), Skipped("larger than 2 MiB"), 5)  # noqa: SLF001 - nor one unreadable
    assert len(state.revs) == 3 and not state.skipped


def test_a_machine_draining_or_switching_in_a_profile_rollout_takes_no_new_task_until_it_starts_again():
    """A cordon, as for maintenance: a task placed on a machine about to switch would only be
    stopped for it. The tasks already there keep it (they are stopped and started in place)."""
    state = RegionState(None, KEYS)
    labels = {"region": "r", "dc": "dc1", "msb": "b1", "rack": "k1", "machine_type": "sky"}
    for rev, mid in enumerate(("a", "b"), start=1):
        state._apply(KEYS.machine(mid), encode(MachineRec(mid, mid, labels, {"cpus": 4, "memory_mb": 8192},  # noqa: SLF001
                                                   entitlement="ent").to_json()), rev)
    state._apply(KEYS.entitlement("ent"), encode(EntitlementRec("ent", "sky", 2).to_json()), 3)  # noqa: SLF001
    state._apply(KEYS.task("ent/old", 0), encode(TaskRec("ent/old", 0, 1, {"cpus": 1, "memory_mb": 256}, "a",  # noqa: SLF001
                                                  "suspended").to_json()), 4)

    def rollout(phase: str, state_: str = "rolling") -> dict:
        return {"id": "r1", "entitlement": "ent", "state": state_, "from": None, "to": None, "machines": {
            "a": {"phase": phase, "batch": 1}, "b": {"phase": "pending", "batch": None}}, "batches": []}

    def placed(n: int) -> set[str]:  # where a new job's tasks land: the fullest machine first
        return set(allocate(state.snapshot(), job("ent/new", count=n, cpus=0.5, memory_mb=64)).task_machines)

    assert placed(1) == {"a"}  # best fit: beside the task already there
    for rev, phase in enumerate(("draining", "switching"), start=5):
        state._apply(KEYS.rollout("ent"), encode(rollout(phase)), rev)  # noqa: SLF001 - the watch's own path
        assert placed(1) == {"b"}, phase
    state._apply(KEYS.rollout("ent"), encode(rollout("starting")), 7)  # noqa: SLF001
    assert placed(1) == {"a"}
    state._apply(KEYS.rollout("ent"), encode(rollout("switching", "done")), 8)  # noqa: SLF001 - a rollout that ended
    assert placed(1) == {"a"}
    for bad in ({"state": "rolling"}, {"state": "rolling", "machines": {"a": "draining"}}, ["not", "a", "record"]):
        state._apply(KEYS.rollout("ent"), encode(bad), 9)  # noqa: SLF001 - unchecked JSON: it cordons nothing
        assert placed(1) == {"a"}, bad
    both = rollout("draining")
    both["machines"]["b"] = {"phase": "switching", "batch": 1}  # max_unavailable 2: both in the batch
    state._apply(KEYS.rollout("ent"), encode(both), 10)  # noqa: SLF001
    with pytest.raises(AllocationError, match="healthy left 2; not cordoned left 0"):
        placed(1)


def test_a_tasks_revision_is_kept_under_its_job_and_index_and_reads_back_as_its_whole_key():
    """A task's whole key was about 85 bytes a task in every process (issue #38): its revision is
    kept under its job's handle and its index. Guards, the index's iteration and deletions read
    whole keys as before; a key under tasks/ that Keys.task would not write stays whole."""
    from controlplane.store.revisions import Revisions

    revs = Revisions(KEYS.machines(), KEYS.tasks())
    revs[KEYS.task("web/api", 3)] = 7
    revs[KEYS.task("web/api", 12)] = 8
    revs[KEYS.tasks() + "web/api/odd"] = 9  # not a task key this version writes
    revs[KEYS.job("web/api")] = 10
    assert list(revs.tasks) == ["web/api"] and revs.tasks["web/api"] == {3: 7, 12: 8}
    assert revs[KEYS.task("web/api", 12)] == 8 and revs.get(KEYS.task("web/api", 4)) is None
    assert KEYS.task("web/api", 3) in revs and KEYS.task("web/other", 3) not in revs
    assert dict(revs.items()) == {KEYS.task("web/api", 3): 7, KEYS.task("web/api", 12): 8,
                                  KEYS.tasks() + "web/api/odd": 9, KEYS.job("web/api"): 10}
    assert len(revs) == 4
    assert revs.pop(KEYS.task("web/api", 3)) == 7
    del revs[KEYS.task("web/api", 12)]
    assert revs.tasks == {} and len(revs) == 2, "a job's dict goes with its last task"
    with pytest.raises(KeyError):
        del revs[KEYS.task("web/api", 12)]
    assert revs.pop(KEYS.task("web/api", 12), None) is None

    state = RegionState(None, KEYS)
    t = TaskRec("web/api", 0, 1, {"cpus": 1, "memory_mb": 256}, None, "pending")
    state._take(KEYS.task("web/api", 0), encode(t.to_json()), 5)  # noqa: SLF001 - the watch's own path
    (handle,) = state.tasks
    (kept,) = state.revs.tasks
    assert kept is handle and state.guard(KEYS.task("web/api", 0)).mod_revision == 5
    state._take(KEYS.task("web/api", 0), None, 6)  # noqa: SLF001 - deleted
    assert state.guard(KEYS.task("web/api", 0)).mod_revision == 0 and not state.revs.tasks


def test_revisions_read_as_a_dict_of_whole_keys_whatever_the_keys():
    """Revisions against a plain dict, through random puts, pops, deletes and reads, with keys of
    every kind: a task's as Keys.task writes it, and keys under tasks/ it does not write (other
    digits, other lengths, no handle), which stay whole and read back the same."""
    from controlplane.store.revisions import Revisions

    rnd = random.Random(38)
    keys = [KEYS.task("web/api", i) for i in (0, 7, 999999)] + [KEYS.task("b/x", 1), KEYS.machine("m1"),
                                                                KEYS.job("web/api"), KEYS.endpoint("web/api", 0)]
    keys += [KEYS.tasks() + s for s in ("web/api/00000²", "web/api/١٠٠٠٠٠", "web/api/12345", "web/api/1234567",
                                        "/000001", "web/api/", "x", "")]
    revs, plain = Revisions(KEYS.machines(), KEYS.tasks()), {}
    for step in range(3000):
        key = rnd.choice(keys)
        op = rnd.random()
        if op < 0.4:
            revs[key] = plain[key] = step
        elif op < 0.6:
            assert revs.pop(key, None) == plain.pop(key, None)
        elif op < 0.7 and key in plain:
            del revs[key], plain[key]
        assert (key in revs) == (key in plain) and revs.get(key) == plain.get(key)
        assert dict(revs.items()) == plain and len(revs) == len(plain)
