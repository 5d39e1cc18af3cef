"""The records' JSON codecs (msgspec): the same JSON as dataclasses.asdict gave, and back."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict

import msgspec
import pytest

from controlplane.store.digest import Digest, dec_hook
from controlplane.store.records import Endpoint, EntitlementRec, EventRec, JobRec, MachineRec, Preference, Spread, TaskRec

TASK = TaskRec("ent/web", 3, 2, {"image": "nginx", "cpus": 0.5, "memory_mb": 256, "env": {"A": "1"}},
               "m1", "running", "placed", True, 1.7e9)
MACHINE = MachineRec("m1", "host1", {"region": "r", "dc": "dc1", "msb": "b1", "rack": "k1", "machine_type": "sky"},
                     {"cpus": 8, "memory_mb": 16384, "hugepages": {"2M": 0}}, "ent",
                     address="10.0.0.1:8700", credential_sha256=Digest.of("secret"), registered_at=1.5)
ENTITLEMENT = EntitlementRec("ent", "sky", 10, "latency", "team", Spread(("dc",), "dc1"), 2, 1.25)
JOB = JobRec("ent", "web", 4, {"image": "nginx", "cpus": 1, "memory_mb": 64}, 3, "sky", "dc1",
             (Preference("rack", "pack", 0.5),), 2, "http://tc", "active", 1.0, 2.0)
EVENT = EventRec("maint-1", "maintenance", ("m1", "m2"), 100.0, "disks", 60.0, 90.0, None, "2 machines", "stop", 5.0)
ENDPOINT = Endpoint("ent/web", 3, "m1", "10.0.0.1", True, 2)


def wire(d: dict) -> dict:
    """What etcd holds, read back."""
    return json.loads(json.dumps(d, sort_keys=True))


@pytest.mark.parametrize("record", [TASK, MACHINE, ENTITLEMENT, EVENT, ENDPOINT], ids=lambda r: type(r).__name__)
def test_to_json_is_the_json_asdict_gave(record):
    gave = asdict(record)
    if isinstance(record, MachineRec):  # the credential's digest was its hex string
        gave["credential_sha256"] = hashlib.sha256(b"secret").hexdigest()
    assert wire(record.to_json()) == wire(gave)
    assert list(record.to_json()) == list(gave), "same keys in the same order"


def test_a_machines_credential_digest_is_its_bytes_in_memory_and_its_hex_in_etcd():
    """The hex a record of an earlier version holds reads as the digest's 32 bytes (81 bytes in
    memory where the hex held 113), by the record's decoder and by the daemon's typed one alike,
    and is written back the same; a released machine's empty digest stays empty; text that is not
    hex matches no credential, as it did."""
    hexed = hashlib.sha256(b"secret").hexdigest()
    old = {**wire(MACHINE.to_json()), "credential_sha256": hexed}
    for m in (MachineRec.from_json(old), msgspec.json.Decoder(MachineRec, dec_hook=dec_hook).decode(json.dumps(old))):
        assert m.credential_sha256 == hashlib.sha256(b"secret").digest() and isinstance(m.credential_sha256, Digest)
        assert m.to_json()["credential_sha256"] == hexed
    assert sys.getsizeof(MACHINE.credential_sha256) < sys.getsizeof(hexed) - 30
    released = MachineRec.from_json({**old, "credential_sha256": ""})
    assert released.credential_sha256 == b"" and not released.credential_sha256
    assert released.to_json()["credential_sha256"] == ""
    odd = MachineRec.from_json({**old, "credential_sha256": "not hex"})
    assert odd.credential_sha256 and odd.credential_sha256 != Digest.of("not hex")
    assert odd.to_json()["credential_sha256"] == b"not hex".hex()


def test_to_json_copies_nested_dicts():
    d = TASK.to_json()
    d["spec"]["env"]["A"] = "changed"
    assert TASK.spec["env"]["A"] == "1"


@pytest.mark.parametrize("record", [TASK, MACHINE, ENTITLEMENT, JOB, EVENT], ids=lambda r: type(r).__name__)
def test_round_trip_through_the_wire(record):
    assert type(record).from_json(wire(record.to_json())) == record


def test_job_json_shape_is_unchanged():
    d = JOB.to_json()
    assert d["preferences"] == [{"property": "rack", "strategy": "pack", "weight": 0.5}]
    assert d["requirements"] == {"machine_type": "sky", "dc": "dc1"} and d["handle"] == "ent/web"


def test_decoding_ignores_unknown_keys_and_takes_ints_for_floats():
    d = {**wire(MACHINE.to_json()), "added_by_a_newer_version": 1, "registered_at": 2}
    m = MachineRec.from_json(d)
    assert m.registered_at == 2.0 and isinstance(m.registered_at, float)
    # what an older version wrote of its tasks' totals is not read: the view sums them from the tasks
    old = {**wire(MACHINE.to_json()), "alloc_tasks": 2, "alloc_cpus": 1.5, "alloc_memory_mb": 512}
    assert MachineRec.from_json(old) == MACHINE
    assert msgspec.json.Decoder(MachineRec, dec_hook=dec_hook).decode(msgspec.json.encode(old)) == MACHINE
    t = TaskRec.from_json({**wire(TASK.to_json()), "later": True})
    assert t == TASK


def test_a_value_of_another_type_is_read_as_before():
    d = {**wire(MACHINE.to_json()), "registered_at": "2"}  # not what the field says: taken as it is
    assert MachineRec.from_json(d).registered_at == "2"
    e = {**wire(ENTITLEMENT.to_json()), "quota": 10.5}
    got = EntitlementRec.from_json(e)
    assert got.quota == 10.5 and got.spread == Spread(("dc",), "dc1")


def test_a_tombstone_written_before_it_carried_its_time_is_read_as_made_at_0():
    """Records written before tombstones carried when they were made have 4 fields; a machine
    holding one must not fail every heartbeat and health pass (IndexError on its time)."""
    from controlplane.store.records import MachineRec
    from controlplane.health.tombstones import gone

    old = MachineRec("m", "m", {"region": "r"}, {"cpus": 4, "memory_mb": 4096}, healthy=False,
                     tombstones=(("e/j", 0, 1.0, 64, 5.0),)).to_json()
    old["tombstones"] = [["e/j", 0, 1.0, 64]]
    rec = MachineRec.from_json(old)
    assert rec.tombstones == (("e/j", 0, 1.0, 64, 0.0),)
    assert gone(rec, {}, at=1.0) == rec.tombstones  # any report the daemon holds speaks for it


def test_task_and_endpoint_records_encode_as_their_json_dicts_do():
    """The scheduler puts task and discovery records as they are and the store encodes them: the
    bytes must be those of their to_json() (what etcd held before, and what RegionState decodes)."""
    from controlplane.store.codec import encode

    task = TaskRec("web/api", 7, 3, {"image": "busybox", "cpus": 0.5, "memory_mb": 256, "env": {"Z": "1", "A": "2"},
                                     "secret_env": {"K": "sealed:v1:abc"}, "ports": [{"name": "http", "port": 80}]},
                   "m-1", "allocated", "placed", False, 1700000000.25)
    endpoint = Endpoint("web/api", 7, "m-1", "10.0.0.1", {"http": 8080}, 3)
    for record in (task, endpoint):
        assert encode(record) == encode(record.to_json())
