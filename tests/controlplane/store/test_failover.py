"""Where the store goes when the member it uses stops answering (issue #24): real etcd processes,
one of them stopped (SIGSTOP: its port still takes connections, nothing answers them, as a member
cut off by a partition)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

from controlplane.store import Store
from controlplane.store.etcd import PICK_TIMEOUT
from controlplane.store.etcdproc import EtcdCluster
from controlplane.store.keys import Keys


def test_a_store_leaving_a_member_passes_over_one_that_does_not_answer(tmp_path):
    keys = Keys(f"test-{uuid.uuid4().hex[:8]}")
    cluster = EtcdCluster(3, data_root=tmp_path).start()
    hung = cluster.members[1].proc
    assert hung is not None
    try:
        async def body():
            store = Store([(m.host, m.port) for m in cluster.members])
            await store.commit([], {keys.machine("a"): {"n": 1}})
            assert store.endpoint == cluster.endpoints[0]
            moved = store.moved()
            os.kill(hung.pid, signal.SIGSTOP)
            since = time.monotonic()
            await store.suspect("taken for cut off by the test")
            took = time.monotonic() - since
            # the next in turn does not answer: the one after it does
            assert store.endpoint == cluster.endpoints[2], store.endpoint
            assert moved.is_set() and store.unavailable == ""
            assert took < PICK_TIMEOUT + 0.5, took
            rev = await store.commit([await store.read(keys.machine("a"))], {keys.machine("a"): {"n": 2}})
            got = await store.read(keys.machine("a"))
            assert got.value == {"n": 2} and got.mod_revision == rev
            await store.close()

        asyncio.run(body())
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        cluster.stop()
