"""Where the store goes when the member it uses stops answering (issue #24): real etcd processes,
one of them stopped (SIGSTOP: its port still takes connections, nothing answers them, as a member
cut off by a partition)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
import uuid

from controlplane.store import Store
from controlplane.store.etcd import PICK_TIMEOUT
from controlplane.store.etcdproc import EtcdCluster
from controlplane.store.keys import Keys
from tests.procs import freeze


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
            freeze(hung.pid)
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


def test_a_read_in_flight_on_the_member_left_behind_is_answered_by_the_next(etcd_server):
    """The store moves while a read waits on a member that answers nothing (a listening socket that
    never speaks): the read ends with the value from the member moved to, not cancelled when the
    old member's client is closed under it."""
    keys = Keys(f"test-{uuid.uuid4().hex[:8]}")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)

        async def body():
            writer = Store([("127.0.0.1", etcd_server.port)])
            await writer.commit([], {keys.machine("a"): {"n": 7}})
            await writer.close()
            store = Store([("127.0.0.1", silent.getsockname()[1]), ("127.0.0.1", etcd_server.port)], timeout=4)
            since = time.monotonic()
            read = asyncio.ensure_future(store.read(keys.machine("a")))
            await asyncio.sleep(0.2)
            await store.suspect("taken for cut off by the test")
            assert store.endpoint == f"127.0.0.1:{etcd_server.port}"
            got = await read
            assert got.value == {"n": 7} and time.monotonic() - since < 7
            await store.close()

        asyncio.run(body())


def test_a_health_check_reports_a_hung_member_and_moves_nothing(tmp_path):
    """Store.check (what /healthz asks): the member in use stopped (SIGSTOP) is reported within its
    CHECK_TIMEOUT, and the store neither moves to another member nor marks itself unavailable (a
    slow member would otherwise fail the daemon over and pause its scheduler at every probe); one
    that refuses (killed) is left for the next member, as any call leaves it."""
    from controlplane.store.etcd import CHECK_TIMEOUT

    cluster = EtcdCluster(3, data_root=tmp_path).start()
    first = cluster.members[0].proc
    assert first is not None
    try:
        async def body():
            store = Store([(m.host, m.port) for m in cluster.members])
            assert await store.check() == ""
            moved = store.moved()
            freeze(first.pid)
            try:
                since = time.monotonic()
                why = await store.check()
                took = time.monotonic() - since
            finally:
                os.kill(first.pid, signal.SIGCONT)
            assert why == f"etcd unreachable at {cluster.endpoints[0]}: no answer in {CHECK_TIMEOUT:g} s", why
            # the check's 2 s, not the store's 10 s for a read (the margin: a connect on a loaded 2-core host)
            assert took < CHECK_TIMEOUT + 3, took
            assert store.endpoint == cluster.endpoints[0] and not moved.is_set() and store.unavailable == ""
            assert await store.check() == "", "answered again once continued"
            cluster.members[0].halt()  # refused from now on
            assert await store.check() == ""
            assert store.endpoint != cluster.endpoints[0] and moved.is_set(), "moved on, as a call would"
            await store.close()

        asyncio.run(body())
    finally:
        cluster.stop()
