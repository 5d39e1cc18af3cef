"""Records a daemon cannot read never crash it nor block its start (issue #11): written straight
into etcd (as an older version, a hand edit or a bug could), they are reported and skipped, and
answers of etcd larger than gRPC's default 4 MiB are read (the 1.5 MB owners that took a daemon
down for good; a range page of large values is read in smaller pages)."""

from __future__ import annotations

import asyncio
import time
import uuid

from controlplane.store import Store
from controlplane.store.keys import Keys
from tests.controlplane.controld_proc import Controld

TASK = {"image": "twine/busybox:1", "command": ["sleep", "1"], "cpus": 0.1, "memory_mb": 16}


def job(name: str, **task) -> dict:
    return {"entitlement": "e", "name": name, "count": 1, "task": {**TASK, **task}, "spec_version": 1}


def write(port: int, puts: dict, raw: dict[str, bytes] | None = None, deletes: tuple = ()) -> None:
    async def go() -> None:
        store = Store([("127.0.0.1", port)])
        try:
            for k, v in puts.items():  # one at a time: each under etcd's request limit
                await store.commit([], {k: v})
            for k, v in (raw or {}).items():
                await store._call(lambda c: c.put(k.encode(), v))  # noqa: SLF001 - bytes that are not JSON
            if deletes:
                await store.commit([], {}, list(deletes))
        finally:
            await store.close()

    asyncio.run(go())


def test_unreadable_and_large_records_are_skipped_and_the_daemon_starts(tmp_path, own_etcd):
    region = "r" + uuid.uuid4().hex[:8]
    keys = Keys(region)
    port = own_etcd.port
    owners = {keys.entitlement(f"o{i}"): {"name": f"o{i}", "machine_type": "generic", "quota": 1,
                                          "owner": "x" * 1_500_000} for i in range(3)}
    junk = {f"{keys.root}junk/{i:03d}": {"filler": "y" * 1_900_000} for i in range(40)}  # 76 MB under the prefix
    write(port, {keys.entitlement("e"): {"name": "e", "machine_type": "generic", "quota": 1},
                 keys.job("e/huge"): job("huge", env={"X": "x" * 3_000_000}),  # past any record's size
                 keys.job("e/odd"): {"entitlement": "e", "name": "odd", "count": "many"},  # not a job record
                 **owners, **junk},
          raw={keys.job("e/text"): b"\x00 not json"})
    c = Controld(tmp_path, port, region=region).start()
    try:
        assert c.call("GET", "/healthz", token=None)[0] == 200
        assert c.metric("twine_records_skipped") == 3
        log = c.log.read_text()
        assert f"skipping the record {keys.job('e/huge')}" in log and "more than the" in log
        assert f"skipping the record {keys.job('e/odd')}" in log
        ents = {e["name"]: e for e in c.call("GET", "/v1/entitlements")[1]["entitlements"]}
        assert {"o0", "o1", "o2", "e"} <= set(ents), "large records that are records are read"

        # while it runs: another unreadable record, and the daemon goes on
        write(port, {keys.job("e/later"): job("later", env={"X": "z" * 2_500_000})})
        for _ in range(50):
            if c.metric("twine_records_skipped") == 4:
                break
            time.sleep(0.1)
        assert c.metric("twine_records_skipped") == 4
        status, _ = c.call("POST", "/v1/jobs", {"entitlement": "e", "name": "ok", "count": 0, "task": TASK})
        assert status == 201
        # rewritten or deleted, a record is no longer skipped
        write(port, {}, deletes=(keys.job("e/huge"), keys.job("e/later"), keys.job("e/odd"), keys.job("e/text")))
        for _ in range(50):
            if c.metric("twine_records_skipped") == 0:
                break
            time.sleep(0.1)
        assert c.metric("twine_records_skipped") == 0
    finally:
        c.close()
