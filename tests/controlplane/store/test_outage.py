"""The store and the index across an etcd outage, against a real etcd that is really stopped and
started again (its own, on its data dir and port: the session's etcd stays up for the others)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from controlplane.store.etcdproc import free_port
from controlplane.store import Index, Store, Unavailable
from controlplane.store.etcd import Change
from controlplane.store.keys import Keys


@pytest.fixture
def keys():
    return Keys(f"test-{uuid.uuid4().hex[:8]}")


async def until(predicate, timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def in_thread(fn) -> None:
    await asyncio.get_running_loop().run_in_executor(None, fn)


def values(index: Index) -> dict[str, object]:
    return {k.rsplit("/", 1)[1]: v.value for k, v in index.items.items()}


def test_index_waits_out_an_outage_and_hands_on_what_changed_meanwhile(own_etcd, keys):
    """etcd goes down; while it is away from the index's endpoint, another client (which reaches
    it elsewhere) deletes, changes and adds keys; when the index's endpoint answers again, the index
    reads afresh and hands every difference to on_change (deletes as None), and follows again."""
    port = own_etcd.port

    async def body():
        store = Store([("127.0.0.1", port)])
        await store.commit([], {keys.machine("a"): {"n": 1}, keys.machine("b"): {"n": 2}, keys.machine("c"): {"n": 3}})
        seen: list[Change] = []
        index = Index(store, keys.machines(), on_change=seen.append)
        await index.start()
        watching = asyncio.create_task(index.watching())

        await in_thread(own_etcd.halt)
        await until(lambda: index.stale, what="the index to notice")
        assert f"etcd unreachable at 127.0.0.1:{port}" in index.stale, index.stale
        with pytest.raises(Unavailable, match=f"etcd unreachable at 127.0.0.1:{port}: "):
            await store.read(keys.machine("a"))
        assert store.unavailable.startswith(f"etcd unreachable at 127.0.0.1:{port}: ")
        assert values(index) == {"a": {"n": 1}, "b": {"n": 2}, "c": {"n": 3}}, "the cache answers as it was"

        # The same etcd (data dir), reachable on another port only: the index's endpoint stays dead.
        own_etcd.port = free_port()
        await in_thread(own_etcd.start)
        other = Store([("127.0.0.1", own_etcd.port)])
        await other.commit([await other.read(keys.machine("a"))], {keys.machine("a"): {"n": 10}, keys.machine("d"): {"n": 4}},
                           [keys.machine("b")])
        _, revision = await other.range(keys.machines())
        await other.close()
        await asyncio.sleep(1.5)
        assert index.stale and values(index)["b"] == {"n": 2}, "still unreachable for the index"
        await in_thread(own_etcd.halt)

        own_etcd.port = port
        await in_thread(own_etcd.start)
        await until(lambda: not index.stale and index.revision >= revision, what="the fresh read")
        assert values(index) == {"a": {"n": 10}, "c": {"n": 3}, "d": {"n": 4}}
        assert sorted((c.key.rsplit("/", 1)[1], c.value) for c in seen) == \
            [("a", {"n": 10}), ("b", None), ("d", {"n": 4})], "exactly the differences"
        assert [c.mod_revision for c in seen if c.value is None] == [index.revision]
        assert index.resyncs == 1 and store.unavailable == ""

        # It follows again, read-your-writes included.
        seen.clear()
        rev = await store.commit([], {keys.machine("e"): {"n": 5}})
        await index.wait_for(rev, timeout=5)
        assert values(index)["e"] == {"n": 5} and [c.key for c in seen] == [keys.machine("e")]
        assert not watching.done(), "an outage does not end watching()"
        watching.cancel()
        await index.stop()
        await store.close()

    asyncio.run(body())


def test_an_outage_with_no_change_hands_on_nothing(own_etcd, keys):
    async def body():
        store = Store([("127.0.0.1", own_etcd.port)])
        await store.commit([], {keys.machine("a"): {"n": 1}})
        seen: list[Change] = []
        index = Index(store, keys.machines(), on_change=seen.append)
        await index.start()
        before = index.revision
        await in_thread(own_etcd.halt)
        await until(lambda: index.stale, what="the index to notice")
        await in_thread(own_etcd.start)
        started = time.monotonic()
        await until(lambda: not index.stale and index.resyncs == 1, what="the fresh read")
        print(f"index current again {time.monotonic() - started:.2f} s after etcd answered")
        assert seen == [] and values(index) == {"a": {"n": 1}} and index.revision == before
        rev = await store.commit([], {keys.machine("a"): {"n": 2}})
        try:
            await index.wait_for(rev, timeout=5)
        except TimeoutError:
            # seen once in a fresh-clone run (b764dd7), not again in 8 runs here: what the index
            # was doing, for whoever meets it next
            raise AssertionError(f"the commit at {rev} did not reach the index in 5 s: revision "
                                 f"{index.revision}, stale {index.stale!r}, resyncs {index.resyncs}, "
                                 f"store at {store.endpoint}, unavailable {store.unavailable!r}") from None
        assert values(index) == {"a": {"n": 2}}
        await index.stop()
        await store.close()

    asyncio.run(body())


def test_a_fresh_read_does_not_hand_on_the_keys_the_owner_keeps_nothing_of(keys):
    """RegionState keeps no discovery record nor its revision (one a task): after an outage, the
    fresh read must not hand each of them on as changed (a million no-op changes, and a log line
    counting them), while what the owner keeps is compared as before."""
    from controlplane.store import Versioned

    async def body():
        seen: list[Change] = []
        revisions = {keys.machine("a"): 3, keys.machine("gone"): 2}
        index = Index(None, keys.root, on_change=seen.append, keep_values=False, revisions=revisions,
                      unkept=(keys.discovery(),))
        await index._resync([Versioned(keys.machine("a"), {"n": 1}, 3),  # noqa: SLF001 - the fresh read's path
                             Versioned(keys.endpoint("web/api", 0), {"index": 0}, 4),
                             Versioned(keys.machine("b"), {"n": 2}, 5)], 6)
        assert [(c.key, c.value) for c in seen] == [(keys.machine("b"), {"n": 2}), (keys.machine("gone"), None)]

    asyncio.run(body())


def test_a_dead_first_endpoint_is_passed_over(etcd_server, keys):
    dead = free_port()  # nobody listens there

    async def body():
        store = Store([("127.0.0.1", dead), ("127.0.0.1", etcd_server.port)])
        rev = await store.commit([], {keys.machine("a"): {"n": 1}})
        assert store.endpoint == f"127.0.0.1:{etcd_server.port}" and store.unavailable == ""
        assert (await store.read(keys.machine("a"))).value == {"n": 1}
        index = Index(store, keys.machines())
        await index.start()
        assert index.revision >= rev and values(index) == {"a": {"n": 1}}
        rev = await store.commit([await store.read(keys.machine("a"))], {keys.machine("a"): {"n": 2}})
        await index.wait_for(rev, timeout=5)
        assert values(index) == {"a": {"n": 2}}
        await index.stop()
        await store.close()

        nowhere = Store([("127.0.0.1", dead), ("127.0.0.1", free_port())])
        with pytest.raises(Unavailable) as e:
            await nowhere.read(keys.machine("a"))
        assert str(e.value).startswith(f"etcd unreachable at 127.0.0.1:{dead}: ") and "; at 127.0.0.1:" in str(e.value)
        assert nowhere.unavailable == str(e.value)
        await nowhere.close()

    asyncio.run(body())


def test_region_state_keeps_the_one_copy_of_revisions_right_across_an_outage(own_etcd, keys):
    """RegionState's index reads raw values and keeps no revisions of its own (the state's are the
    one copy, a million keys' worth): after an outage its fresh read still hands on exactly what
    changed, a record that could not be read and was deleted meanwhile included."""
    from controlplane.store.records import MachineRec
    from controlplane.store.state import RegionState

    port = own_etcd.port

    def rec(mid: str, cpus: int) -> dict:
        return MachineRec(mid, mid, {"region": keys.region}, {"cpus": cpus, "memory_mb": 1024}).to_json()

    async def body():
        store = Store([("127.0.0.1", port)])
        await store.commit([], {keys.machine("a"): rec("a", 1), keys.machine("b"): rec("b", 2)})
        await store._call(lambda c: c.put(keys.machine("bad").encode(), b"{not json"))  # noqa: SLF001
        state = RegionState(store, keys)
        await state.start()
        assert state.index.revisions is state.revs and set(state.machines) == {"a", "b"}
        assert list(state.skipped) == [keys.machine("bad")]

        await in_thread(own_etcd.halt)
        await until(lambda: state.stale, what="the state to notice")
        own_etcd.port = free_port()  # the same data, on a port the state does not use
        await in_thread(own_etcd.start)
        other = Store([("127.0.0.1", own_etcd.port)])
        await other.commit([], {keys.machine("a"): rec("a", 5), keys.machine("c"): rec("c", 3)},
                           [keys.machine("b"), keys.machine("bad")])
        want, revision = await other.range(keys.root)
        await other.close()
        await in_thread(own_etcd.halt)
        own_etcd.port = port
        await in_thread(own_etcd.start)
        await until(lambda: not state.stale and state.revision >= revision, what="the fresh read")

        assert {mid: m.capacity["cpus"] for mid, m in state.machines.items()} == {"a": 5, "c": 3}
        assert state.skipped == {}, "the unreadable record's deletion was handed on"
        assert state.revs == {v.key: v.mod_revision for v in want}
        assert state.index.revisions is state.revs
        await state.stop()
        await store.close()

    asyncio.run(body())
