"""The store against a real etcd: guarded transactions, optimistic retries, the watched index."""

from __future__ import annotations

import asyncio
import uuid

import aetcd.exceptions

import pytest

from controlplane.store import Conflict, Index, Store
from controlplane.store.keys import Keys


@pytest.fixture
def keys():
    return Keys(f"test-{uuid.uuid4().hex[:8]}")  # a region of this test's own


def run(coro):
    return asyncio.run(coro)


def test_commit_is_guarded_by_the_revisions_read(etcd_server, keys):
    async def body():
        store = Store([("127.0.0.1", etcd_server.port)])
        k = keys.machine("m1")
        absent = await store.read(k)
        assert absent.value is None and absent.mod_revision == 0
        rev = await store.commit([absent], {k: {"cpus": 4}})
        now = await store.read(k)
        assert now.value == {"cpus": 4} and now.mod_revision == rev
        with pytest.raises(Conflict):  # a stale read loses and writes nothing
            await store.commit([absent], {k: {"cpus": 8}, keys.machine("m2"): {"cpus": 1}})
        assert (await store.read(k)).value == {"cpus": 4}
        assert (await store.read(keys.machine("m2"))).value is None
        await store.close()

    run(body())


def test_concurrent_updates_all_land_through_retries(etcd_server, keys):
    async def body():
        store = Store([("127.0.0.1", etcd_server.port)])
        k = keys.entitlement("e1")

        def add_one(reads):
            cur = reads[k].value or {"machines": 0}
            return {k: {"machines": cur["machines"] + 1}}, []

        await asyncio.gather(*(store.update([k], add_one) for _ in range(20)))
        assert (await store.read(k)).value == {"machines": 20}  # no lost update
        await store.close()

    run(body())


def test_index_is_built_by_range_and_kept_current_by_watch(etcd_server, keys):
    async def body():
        store = Store([("127.0.0.1", etcd_server.port)])
        await store.commit([], {keys.machine("a"): {"n": 1}, keys.machine("b"): {"n": 2}})
        index = Index(store, keys.machines())
        await index.start()
        assert {v.value["n"] for v in index.items.values()} == {1, 2}
        rev = await store.commit([await store.read(keys.machine("a"))], {keys.machine("a"): {"n": 10}, keys.machine("c"): {"n": 3}})
        await index.wait_for(rev)
        rev = await store.commit([], {}, [keys.machine("b")])
        await index.wait_for(rev)
        assert {k.rsplit("/", 1)[1]: v.value["n"] for k, v in index.items.items()} == {"a": 10, "c": 3}
        # A fresh index (a restarted daemon) rebuilds the same view.
        again = Index(store, keys.machines())
        await again.start()
        assert {k: v.value for k, v in again.items.items()} == {k: v.value for k, v in index.items.items()}
        await index.stop()
        await again.stop()
        await store.close()

    run(body())


def test_wait_for_a_large_commit_sees_all_of_it(etcd_server, keys):
    """etcd may deliver one transaction's events in several watch responses: waiting for the
    revision a commit returned must see every key it wrote, not only the first (this failed about
    half the time with 200 keys before the commit counted its events)."""

    async def go() -> list[int]:
        store = Store([("127.0.0.1", etcd_server.port)])
        seen = []
        try:
            for n in range(8):
                index = Index(store, keys.machines())
                await index.start()
                rev = await store.commit([], {keys.machine(f"batch{n}-{i}"): {"i": i, "pad": "x" * 300}
                                              for i in range(200)}, [keys.machine("absent")])
                assert rev.events == 200, "a delete that found no key makes no event"
                await index.wait_for(rev)
                seen.append(sum(1 for k in index.items if f"batch{n}-" in k))
                await index.stop()
        finally:
            await store.close()
        return seen

    assert run(go()) == [200] * 8


def test_a_range_larger_than_one_grpc_answer_is_read_in_pages_at_one_revision(etcd_server, monkeypatch):
    """12,000 keys of 600 bytes (7 MB: over gRPC's 4 MB answer), read in pages of 5,000; a write
    made between the pages (a key changed, one added) is not in the read: every page is read at
    the first page's revision."""
    import asyncio
    import uuid

    import controlplane.store.etcd as etcd_module
    from controlplane.store import Store

    prefix = f"/paging-{uuid.uuid4().hex[:8]}/"
    real_page = etcd_module._range_page
    pages: list[int] = []

    async def body():
        store = Store([("127.0.0.1", etcd_server.port)])
        writer = Store([("127.0.0.1", etcd_server.port)])

        async def page_then_write(c, start, end, limit, revision):
            got = await real_page(c, start, end, limit, revision)
            pages.append(len(got.kvs))
            if len(pages) == 1:
                await writer.commit([], {f"{prefix}011000": {"pad": "", "i": -1}, f"{prefix}zzz": {"i": -2}})
            return got

        try:
            for base in range(0, 12_000, 1000):
                await store.commit([], {f"{prefix}{i:06d}": {"pad": "x" * 580, "i": i} for i in range(base, base + 1000)})
            monkeypatch.setattr(etcd_module, "_range_page", page_then_write)
            items, revision = await store.range(prefix)
            monkeypatch.setattr(etcd_module, "_range_page", real_page)
            now, _ = await store.range(prefix)
            return items, revision, now
        finally:
            await store.close()
            await writer.close()

    items, revision, now = asyncio.run(body())
    assert pages == [5000, 5000, 2000]
    assert [v.value["i"] for v in items] == list(range(12_000))
    assert all(v.mod_revision <= revision for v in items)
    assert len(now) == 12_001 and now[11_000].value["i"] == -1  # the write landed, after the read's revision


def test_a_cancel_that_comes_back_as_the_calls_error_is_a_cancel(etcd_server):
    """grpc can answer a cancelled call with its own error (CANCELLED) instead of raising the
    cancel: the store raises CancelledError then, so that no caller retries a cancelled call (issue
    #12: a deposed scheduler's loop, cancelled, went on and on). An error of a call nobody
    cancelled is still the error."""
    async def body() -> None:
        store = Store([("127.0.0.1", etcd_server.port)])
        started = asyncio.Event()

        async def call(client):  # a call whose cancel comes back as the client library's error
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise aetcd.exceptions.ClientError("StatusCode.CANCELLED: Locally cancelled by application!")

        async def failing(client):
            raise aetcd.exceptions.ClientError("etcdserver: some answer")

        try:
            task = asyncio.create_task(store._call(call))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(aetcd.exceptions.ClientError, match="some answer"):
                await store._call(failing)
        finally:
            await store.close()

    asyncio.run(body())


def test_create_takes_an_absent_key_and_otherwise_answers_who_holds_it(etcd_server, keys):
    """The leader election's create (coordinator.py): the first caller's value, leased; a second
    caller gets the first's value and revision back, and its own value is not written."""
    async def body():
        store = Store([("127.0.0.1", etcd_server.port)])
        a, b = await store.grant(10), await store.grant(10)
        k = keys.leader(0)
        mine = await store.create(k, {"member": "a"}, a)
        assert mine.value == {"member": "a"} and mine.mod_revision > 0
        theirs = await store.create(k, {"member": "b"}, b)
        assert (theirs.value, theirs.mod_revision) == ({"member": "a"}, mine.mod_revision)
        assert (await store.read(k)).value == {"member": "a"}
        await store.revoke(a)
        await store.revoke(b)
        await store.close()

    run(body())


def test_a_transaction_request_is_each_guard_put_and_delete_in_order():
    """txn_request fills each operation in place: the request is the one made of a message per
    operation (etcd's TxnRequest as its documentation builds it), byte for byte."""
    from controlplane.store.codec import encode
    from controlplane.store.etcd import Versioned, txn_request

    rpc = aetcd.rpc
    reads = [Versioned("/a", None, 7), Versioned("/b", None, 0)]
    puts = {"/a": {"x": 1}, "/c": {"y": [1, 2]}}
    deletes = ["/d", ("/e/", "/e0")]
    want = rpc.TxnRequest(
        compare=[rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, key=b"/a", mod_revision=7),
                 rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, key=b"/b", mod_revision=0)],
        success=[rpc.RequestOp(request_put=rpc.PutRequest(key=b"/a", value=encode({"x": 1}))),
                 rpc.RequestOp(request_put=rpc.PutRequest(key=b"/c", value=encode({"y": [1, 2]}))),
                 rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=b"/d")),
                 rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=b"/e/", range_end=b"/e0"))])
    got = txn_request(reads, puts, deletes)
    assert got == want and got.SerializeToString() == want.SerializeToString()
    assert [op.WhichOneof("request") for op in got.success] == ["request_put"] * 2 + ["request_delete_range"] * 2
