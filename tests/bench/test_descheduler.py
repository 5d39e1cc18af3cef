"""The benchmark's descheduler baseline (bench/descheduler.py) on the rules of the descheduler's
documentation: LowNodeUtilization's thresholds and its room on the underutilized nodes, the
per-node eviction limit, RemoveDuplicates' balance over the feasible nodes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from descheduler import Node, Pod, high_node_utilization, low_node_utilization, remove_duplicates  # noqa: E402


def node(i: str) -> Node:
    return Node(i, 10_000, 10_000, pods=100)


def pods(on: str, n: int, cpus: int = 1000, owner: str = "j", start: int = 0) -> list[Pod]:
    return [Pod((owner, start + k), on, owner, cpus, 100) for k in range(n)]


def test_nothing_is_evicted_without_an_underutilized_node():
    # a at 80 % cpu (over 50 %), b at 30 % (between the thresholds): b is not underutilized
    assert low_node_utilization([node("a"), node("b")], pods("a", 8) + pods("b", 3, start=8)) == []


def test_pods_leave_the_overutilized_node_until_it_is_below_the_targets():
    # a: 80 % cpu; b: empty, so underutilized (below 20 % in all); b has room for 50 % of 10 cores
    ev = low_node_utilization([node("a"), node("b")], pods("a", 8))
    assert len(ev) == 3 and {p.node for p in ev} == {"a"}, "80 % -> 50 %: three pods of 10 %"


def test_the_room_on_the_underutilized_nodes_bounds_the_evictions():
    # two overutilized nodes at 90 %; one underutilized node at 10 %: room up to 50 % is 4 cores
    ns = [node("a"), node("b"), node("c")]
    ev = low_node_utilization(ns, pods("a", 9) + pods("b", 9, start=9) + pods("c", 1, start=18))
    assert sum(p.cpus for p in ev) == 4000, [p.key for p in ev]


def test_the_per_node_limit_holds():
    ev = low_node_utilization([node("a"), node("b")], pods("a", 9), per_node=2)
    assert len(ev) == 2


def test_remove_duplicates_balances_an_owner_over_its_feasible_nodes():
    # 4 pods of j on node a; 4 feasible nodes: a keeps 1, 3 are evicted
    assert len(remove_duplicates(pods("a", 4), {"j": 4})) == 3
    # 4 pods on a, 2 feasible nodes: a keeps ceil(4 / 2) = 2
    assert len(remove_duplicates(pods("a", 4), {"j": 2})) == 2
    # one pod a node: no duplicates
    assert remove_duplicates(pods("a", 1) + pods("b", 1, start=1), {"j": 2}) == []
    assert len(remove_duplicates(pods("a", 4), {"j": 4}, per_node=1)) == 1


def test_high_node_utilization_empties_the_underutilized_nodes_least_utilized_first():
    # a at 10 %, b at 0 % (no pods: nothing to evict), c at 60 %: a's pod goes, c is where it lands
    assert [p.key for p in high_node_utilization([node("a"), node("b"), node("c")],
                                                 pods("a", 1) + pods("c", 6, start=1))] == [("j", 0)]
    # a at 10 % cpu, d at 19 % (one pod of 1.9 cores): both underutilized, a the less, so a first
    ns = [node("a"), node("d"), node("c")]
    ev = high_node_utilization(ns, pods("d", 1, cpus=1900) + pods("a", 1, start=1) + pods("c", 6, start=2))
    assert [p.node for p in ev] == ["a", "d"], "the least utilized node first"


def test_high_node_utilization_needs_room_on_the_other_nodes_and_an_other_node():
    # c at 90 % cpu has 1 core of room: a's 1-core pod is evicted, then the room is gone, d's stay
    ev = high_node_utilization([node("a"), node("d"), node("c")],
                               pods("a", 1) + pods("d", 1, start=1, cpus=1500) + pods("c", 9, start=2))
    assert [p.node for p in ev] == ["a"]
    # every node underutilized: nowhere for pods to go, nothing evicted
    assert high_node_utilization([node("a"), node("b")], pods("a", 1) + pods("b", 1, start=1)) == []
    # a node at 20 % is not underutilized ("below" the threshold)
    assert high_node_utilization([node("a"), node("c")], pods("a", 2) + pods("c", 6, start=2)) == []


def test_high_node_utilization_per_node_limit_and_number_of_nodes():
    ns = [node("a"), node("c")]
    two = pods("a", 1, cpus=500) + pods("a", 1, start=1, cpus=500) + pods("c", 5, start=2)
    assert len(high_node_utilization(ns, two, per_node=1)) == 1
    assert high_node_utilization(ns, two, number_of_nodes=1) == [], "one underutilized node is not more than 1"
