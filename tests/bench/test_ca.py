"""The benchmark's Cluster Autoscaler baseline (bench/ca.py) on the rules of the autoscaler's FAQ:
the 0.5 utilization threshold, pods that must fit elsewhere, 10 minutes unneeded, one non-empty
node a scan, no scale-down for 10 minutes after a scale-up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from ca import DELAY_AFTER_ADD, SCAN_INTERVAL, UNNEEDED_TIME, ClusterAutoscaler, Node, unneeded  # noqa: E402


def scans(ca: ClusterAutoscaler, machines: dict[str, int], start: float, until: float) -> list[tuple[float, str]]:
    """Scans every SCAN_INTERVAL from `start`; each drained machine's pods moved best fit."""
    out, now = [], start
    while now <= until:
        m = ca.scan(now, machines)
        if m is not None:
            out.append((now, m))
            n = machines.pop(m)
            for _ in range(n):
                dest = min((o for o in machines if machines[o] < ca.slots), key=lambda o: (ca.slots - machines[o], o))
                machines[dest] += 1
        now += SCAN_INTERVAL
    return out


def test_a_node_under_half_whose_pods_fit_elsewhere_goes_after_ten_minutes_not_before():
    ca = ClusterAutoscaler(slots=4)
    machines = {"a": 1, "b": 2, "c": 4}  # a at 25 %: unneeded; b at 50 % is not "smaller than 50 %"
    drained = scans(ca, machines, 0.0, UNNEEDED_TIME + 60)
    assert drained == [(UNNEEDED_TIME, "a")]
    assert machines == {"b": 3, "c": 4}, "the pod went to the fullest machine with room"


def test_a_node_whose_pods_fit_nowhere_else_stays():
    ca = ClusterAutoscaler(slots=4)
    assert scans(ca, {"a": 1, "b": 4, "c": 4}, 0.0, 2 * UNNEEDED_TIME) == []


def test_two_unneeded_nodes_do_not_count_on_the_same_room():
    # a and b each hold 1 pod; c has room for one: only one of them is unneeded
    ca = ClusterAutoscaler(slots=4)
    ca.scan(0.0, {"a": 1, "b": 1, "c": 3})
    assert set(ca.unneeded_since) == {"a"}


def test_one_non_empty_node_a_scan():
    ca = ClusterAutoscaler(slots=4)
    machines = {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    drained = scans(ca, machines, 0.0, UNNEEDED_TIME + 5 * SCAN_INTERVAL)
    times = [t for t, _ in drained]
    assert len(times) == len(set(times)), drained
    assert times[0] == UNNEEDED_TIME and len(drained) >= 2, drained


def test_a_node_that_becomes_needed_starts_its_ten_minutes_again():
    ca = ClusterAutoscaler(slots=4)
    ca.scan(0.0, {"a": 1, "b": 2})
    assert ca.scan(300.0, {"a": 2, "b": 2}) is None  # a at 50 %: needed again
    assert ca.scan(310.0, {"a": 1, "b": 2}) is None
    assert ca.scan(310.0 + UNNEEDED_TIME - SCAN_INTERVAL, {"a": 1, "b": 2}) is None
    assert ca.scan(310.0 + UNNEEDED_TIME, {"a": 1, "b": 2}) == "a"


def test_no_scale_down_for_ten_minutes_after_the_group_grew():
    ca = ClusterAutoscaler(slots=4)
    ca.scan(0.0, {"a": 1, "b": 2})
    ca.grew(500.0)
    assert ca.scan(UNNEEDED_TIME, {"a": 1, "b": 2}) is None, "unneeded long enough, but the group grew at 500 s"
    assert ca.scan(500.0 + DELAY_AFTER_ADD, {"a": 1, "b": 2}) == "a"


def test_both_cpu_and_memory_must_be_under_half_and_each_pod_must_fit_by_its_requests():
    big = {"a": Node(16, 64, {"p": (2, 40)}),  # 12 % of cpu, 62 % of memory: needed
           "b": Node(16, 64, {"q": (4, 8)}),  # 25 % and 12 %: unneeded if q fits elsewhere
           "c": Node(16, 64, {"r": (10, 20)})}
    assert [(n, place) for n, place in unneeded(big)] == [("b", {"q": "c"})], "q on the fullest that holds it"
    # q needs 7 cores: c has 6 left, a has 14: it goes to a
    assert unneeded({**big, "b": Node(16, 64, {"q": (7, 8)})}) == [("b", {"q": "a"})]
    # a candidate filter: b may not be removed (its pods may not move), so nothing is
    assert unneeded(big, candidate=lambda n: n != "b") == []
