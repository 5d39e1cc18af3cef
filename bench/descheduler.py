"""The Kubernetes descheduler's LowNodeUtilization, HighNodeUtilization and RemoveDuplicates
strategies, baselines for bench_rebalancer.py, written from the descheduler's documentation (its
README, "Policy and Strategies"), with the thresholds the issues name:

LowNodeUtilization (thresholds cpu/memory/pods 20 %, targetThresholds 50 %; utilization is what
the pods *request* over what the node has):
- a node is underutilized when every resource is below its threshold, overutilized when any is
  above its target threshold; the others are appropriately utilized and left alone;
- with no underutilized node (or no more than numberOfNodes of them) nothing is evicted;
- pods are evicted from the overutilized nodes, the most utilized node first, until the node is
  no longer above any target threshold, or until the room the underutilized nodes have up to the
  target thresholds is used up (the evicted pods' requests count against it);
- at most maxNoOfPodsToEvictPerNode pods a node.

HighNodeUtilization (thresholds cpu/memory/pods 20 %; meant to run with the scheduler scoring
MostAllocated, so that evicted pods land compactly and the emptied nodes can be scaled down):
- a node is underutilized when every resource is below its threshold; every other node is
  appropriately utilized, and is where pods go;
- with no underutilized node (or no more than numberOfNodes of them), or no other node, nothing
  is evicted;
- pods are evicted from the underutilized nodes, the least utilized first, while the other nodes
  have room left in every resource up to what they have (the evicted pods' requests count against
  it; the last may overshoot, as the descheduler checks the room before each eviction);
- at most maxNoOfPodsToEvictPerNode pods a node.

RemoveDuplicates: the pods of one owner (a ReplicaSet; here a job) on one node beyond the first are
duplicates; where the owner's pods could run on more nodes, the pods are balanced: a node keeps
at most ceil(pods / feasible nodes) of them and the rest are evicted (the same per-node limit).

Evicted pods are placed again by a scheduler: the benchmark uses our allocator (the descheduler
never chooses where a pod goes). Not the descheduler's code: its rules, written here."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

THRESHOLDS = {"cpu": 20.0, "memory": 20.0, "pods": 20.0}
TARGETS = {"cpu": 50.0, "memory": 50.0, "pods": 50.0}
PODS_PER_NODE = 110  # the kubelet's default maxPods: the "pods" resource's capacity


@dataclass(frozen=True)
class Node:
    id: str
    cpus: int  # millicores allocatable
    memory_mb: int
    pods: int = PODS_PER_NODE


@dataclass(frozen=True)
class Pod:
    key: tuple[str, int]
    node: str
    owner: str
    cpus: int  # millicores requested
    memory_mb: int


def _percent(node: Node, use: dict[str, float]) -> dict[str, float]:
    return {"cpu": 100.0 * use["cpu"] / node.cpus, "memory": 100.0 * use["memory"] / node.memory_mb,
            "pods": 100.0 * use["pods"] / node.pods}


def _requested(nodes: list[Node], pods: list[Pod]) -> tuple[dict[str, dict[str, float]], dict[str, list[Pod]]]:
    """Each node's requested cpu, memory and pods, and its pods."""
    use = {n.id: {"cpu": 0.0, "memory": 0.0, "pods": 0.0} for n in nodes}
    on: dict[str, list[Pod]] = {n.id: [] for n in nodes}
    for p in pods:
        u = use[p.node]
        u["cpu"] += p.cpus
        u["memory"] += p.memory_mb
        u["pods"] += 1
        on[p.node].append(p)
    return use, on


def low_node_utilization(nodes: list[Node], pods: list[Pod], thresholds: dict = THRESHOLDS,
                         targets: dict = TARGETS, per_node: int | None = None,
                         number_of_nodes: int = 0) -> list[Pod]:
    """The pods LowNodeUtilization evicts in one run."""
    use, on = _requested(nodes, pods)
    by_id = {n.id: n for n in nodes}
    pct = {n.id: _percent(n, use[n.id]) for n in nodes}
    under = [n for n in nodes if all(pct[n.id][r] < thresholds[r] for r in thresholds)]
    over = [n for n in nodes if any(pct[n.id][r] > targets[r] for r in targets)]
    if len(under) <= number_of_nodes or not over:
        return []
    # the room the underutilized nodes have up to the target thresholds
    room = {"cpu": sum(n.cpus * targets["cpu"] / 100 - use[n.id]["cpu"] for n in under),
            "memory": sum(n.memory_mb * targets["memory"] / 100 - use[n.id]["memory"] for n in under),
            "pods": sum(n.pods * targets["pods"] / 100 - use[n.id]["pods"] for n in under)}
    evicted = []
    for n in sorted(over, key=lambda n: -sum(pct[n.id].values())):
        count = 0
        # the descheduler sorts a node's pods by priority (all equal here), then evicts in order
        for p in sorted(on[n.id], key=lambda p: (p.owner, p.key)):
            if not any(_percent(by_id[n.id], use[n.id])[r] > targets[r] for r in targets):
                break
            if any(room[r] <= 0 for r in room) or (per_node is not None and count >= per_node):
                break
            evicted.append(p)
            count += 1
            for r, v in (("cpu", p.cpus), ("memory", p.memory_mb), ("pods", 1)):
                use[n.id][r] -= v
                room[r] -= v
        if any(room[r] <= 0 for r in room):
            break
    return evicted


def high_node_utilization(nodes: list[Node], pods: list[Pod], thresholds: dict = THRESHOLDS,
                          per_node: int | None = None, number_of_nodes: int = 0) -> list[Pod]:
    """The pods HighNodeUtilization evicts in one run."""
    use, on = _requested(nodes, pods)
    pct = {n.id: _percent(n, use[n.id]) for n in nodes}
    under = [n for n in nodes if all(pct[n.id][r] < thresholds[r] for r in thresholds)]
    rest = [n for n in nodes if n not in under]
    if len(under) <= number_of_nodes or not rest:
        return []
    room = {"cpu": sum(n.cpus - use[n.id]["cpu"] for n in rest),
            "memory": sum(n.memory_mb - use[n.id]["memory"] for n in rest),
            "pods": sum(n.pods - use[n.id]["pods"] for n in rest)}
    evicted = []
    for n in sorted(under, key=lambda n: (sum(pct[n.id].values()), n.id)):
        count = 0
        for p in sorted(on[n.id], key=lambda p: (p.owner, p.key)):
            if any(room[r] <= 0 for r in room) or (per_node is not None and count >= per_node):
                break
            evicted.append(p)
            count += 1
            for r, v in (("cpu", p.cpus), ("memory", p.memory_mb), ("pods", 1)):
                room[r] -= v
        if any(room[r] <= 0 for r in room):
            break
    return evicted


def remove_duplicates(pods: list[Pod], feasible: dict[str, int], per_node: int | None = None) -> list[Pod]:
    """The pods RemoveDuplicates evicts in one run. `feasible`: per owner, the nodes its pods may run on."""
    by_owner: dict[str, list[Pod]] = {}
    for p in pods:
        by_owner.setdefault(p.owner, []).append(p)
    evicted = []
    per: Counter = Counter()
    for owner, ps in sorted(by_owner.items()):
        upper = max(1, math.ceil(len(ps) / max(1, feasible.get(owner, 1))))
        on: dict[str, list[Pod]] = {}
        for p in ps:
            on.setdefault(p.node, []).append(p)
        for node, here in sorted(on.items()):
            for p in sorted(here, key=lambda p: p.key)[upper:]:
                if per_node is not None and per[node] >= per_node:
                    break
                evicted.append(p)
                per[node] += 1
    return evicted
