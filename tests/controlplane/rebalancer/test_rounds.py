"""A round's requests in the jobs' rebalance records (controlplane/rebalancer/rounds.py), on real etcd."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from controlplane.rebalancer.board import Planned
from controlplane.rebalancer.rounds import request_moves
from controlplane.scheduler.moverecords import cooling, moves_of
from controlplane.store import Store
from controlplane.store.keys import Keys
from controlplane.store.state import RegionState


def test_a_round_that_replaces_a_jobs_earlier_requests_says_so(etcd_server):
    """Round 1 asks to move task 0 of a job; round 2 comes before that move began. It leaves task 0
    alone (cooling: requested, not begun) and asks to move task 1. Round 2's plan was made with task
    0 where it is (its target's room free): its requests replace the job's, and task 0's goes to
    `recent` as superseded, where before it was lost without a word (kept beside round 2's, the
    two could fill one target twice over: the shard leader vets each against the same free room)."""
    async def body() -> None:
        keys = Keys("rb" + uuid.uuid4().hex[:8])
        store = Store([("127.0.0.1", etcd_server.port)])
        state = RegionState(store, keys)
        await state.start()
        try:
            first = SimpleNamespace(moves=(Planned("web/api", 0, "m1", "m2", "compaction", "m1 freed"),), taken={})
            assert await request_moves(state, first, "round-1", now=1000.0) == 1
            assert ("web/api", 0) in cooling(state.rebalance, 1001.0), "round 2 leaves task 0 alone"
            second = SimpleNamespace(moves=(Planned("web/api", 1, "m3", "m2", "compaction", "m3 freed"),), taken={})
            assert await request_moves(state, second, "round-2", now=1010.0) == 1
            record = state.rebalance["web/api"]
            asked = moves_of(record)
            assert sorted(asked) == [1] and (asked[1]["round"], asked[1]["source"]) == ("round-2", "m3"), asked
            assert record["recent"]["0"] == {"at": 1010.0, "target": "m2",
                                             "outcome": "superseded: round round-2 planned without it"}, record
            assert ("web/api", 0) in cooling(state.rebalance, 1011.0)
        finally:
            await state.stop()
            await store.close()

    asyncio.run(body())
