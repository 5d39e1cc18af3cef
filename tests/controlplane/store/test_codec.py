"""etcd values are JSON with sorted keys, written by msgspec: the JSON json.dumps wrote, read back the
same, and what only json handles still goes through it."""

from __future__ import annotations

import json

from controlplane.store.records import MachineRec, TaskRec
from controlplane.store.codec import decode, encode

TASK = TaskRec("ent/web", 3, 2, {"image": "nginx", "cpus": 0.5, "memory_mb": 256, "env": {"Z": "1", "A": "é"}},
               "m1", "running", "placed", True, 1.7e9)
MACHINE = MachineRec("m1", "host1", {"region": "r", "dc": "dc1", "msb": "b1", "rack": "k1", "machine_type": "sky"},
                     {"cpus": 8, "memory_mb": 16384}, "ent", registered_at=1e16)


def old_encode(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def test_same_json_as_json_dumps_in_meaning_and_key_order():
    for value in (TASK.to_json(), MACHINE.to_json(), {"b": [1, 2.5, None, True], "a": {"y": 1, "x": ()}}):
        raw = encode(value)
        assert json.loads(raw) == json.loads(old_encode(value))
        assert list(json.loads(raw)) == sorted(value) and raw.startswith(b'{"')
        assert b", " not in raw and b": " not in raw  # compact
        assert decode(raw) == decode(old_encode(value)) == json.loads(old_encode(value))


def test_records_round_trip():
    assert TaskRec.from_json(decode(encode(TASK.to_json()))) == TASK
    assert MachineRec.from_json(decode(encode(MACHINE.to_json()))) == MACHINE


def test_keys_that_are_not_strings_are_written_as_json_writes_them():
    assert encode({2: "b", 1: "a"}) == old_encode({2: "b", 1: "a"}) == b'{"1":"a","2":"b"}'


def test_values_json_dumps_wrote_with_nan_still_read():
    got = decode(old_encode({"x": float("nan"), "y": 1}))
    assert got["y"] == 1 and got["x"] != got["x"]
