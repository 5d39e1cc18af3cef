"""The pure parts of replica coordination: flags, health ownership by rendezvous hashing, the
persisted rate-limit buckets. (Elections and fencing run against real etcd and real processes in
test_replicas_chaos.py and test_election.py.)"""

from __future__ import annotations

import pytest

from controlplane.coordination.coordinator import parse_roles, parse_shards, rendezvous
from controlplane.scheduler.ratelimit import Limiter, Limits


def test_roles_and_shards_parse_and_bad_ones_name_the_problem():
    assert parse_roles("frontend,scheduler") == ("frontend", "scheduler")
    with pytest.raises(ValueError, match="roles are a comma-separated subset"):
        parse_roles("frontend,sched")
    assert parse_shards("all", 4) == (0, 1, 2, 3)
    assert parse_shards("0-2,7", 8) == (0, 1, 2, 7)
    with pytest.raises(ValueError, match="the region has 4 shard"):
        parse_shards("2-5", 4)
    with pytest.raises(ValueError, match="N or N-M"):
        parse_shards("a-b", 4)


def test_rendezvous_spreads_machines_and_a_leaving_member_moves_only_its_own():
    members = ["a", "b", "c", "d"]
    machines = [f"m{i}" for i in range(4000)]
    owner = {m: rendezvous(members, m) for m in machines}
    counts = {x: sum(1 for o in owner.values() if o == x) for x in members}
    assert all(800 < n < 1200 for n in counts.values()), counts
    after = {m: rendezvous(["a", "b", "d"], m) for m in machines}
    moved = [m for m in machines if after[m] != owner[m]]
    assert moved and all(owner[m] == "c" for m in moved)
    assert rendezvous([], "m1") is None


def test_rate_limit_buckets_round_trip_through_their_records():
    lim = Limiter(Limits(job=(0.001, 3), shard=(0.001, 10), region=(0.001, 20)), shard=2)
    records = lim.take("web/api", 2)
    assert set(records) == {"shard-0002", "region"}
    assert records["shard-0002"]["jobs"]["web/api"]["tokens"] == pytest.approx(1.0, abs=0.01)
    again = Limiter(Limits(job=(0.001, 3), shard=(0.001, 10), region=(0.001, 20)), shard=2)
    assert again.available("web/api") == 3  # a fresh limiter is full...
    again.load(records)
    assert again.available("web/api") == 1  # ...one loaded from etcd's records is not
    assert again.shard.available() == pytest.approx(8, abs=0.01)
    assert again.region.available() == pytest.approx(18, abs=0.01)
    other_shard = Limiter(Limits(job=(0.001, 3), shard=(0.001, 10), region=(0.001, 20)), shard=3)
    other_shard.load(records)
    assert other_shard.available("web/api") == 3 and other_shard.region.available() == pytest.approx(18, abs=0.01)
