"""The Kubernetes Cluster Autoscaler's scale-down, a baseline for bench_srm.py (hpa+ca), written
from the autoscaler's FAQ ("How does scale-down work?", "What are the parameters to CA?") with its
documented defaults:

- every scan (--scan-interval 10 s) the autoscaler looks for unneeded nodes: a node is unneeded
  when the sum of its pods' cpu requests and the sum of their memory requests are both smaller than
  --scale-down-utilization-threshold (0.5) of what the node has, and every pod on it can be moved
  to the other nodes (a scheduling simulation: the pods of the nodes found unneeded before it in the
  same scan count as moved already, so that no two unneeded nodes count on the same room);
- a node unneeded for --scale-down-unneeded-time (10 minutes) is removed; an empty node goes at
  once with the others that are empty, a node with pods one at a time (a scan drains one at most):
  its pods are evicted, and their controller starts them again elsewhere;
- no scale-down for --scale-down-delay-after-add (10 minutes) after the node group grew.

One instance is one node group (here: one job's entitlement, as bench_srm.py keeps each job on its
own). Utilization here is the tasks' share of a machine's slots (a task requests one slot's cpu
and memory). Where the evicted pods go is the caller's choice: bench_srm.py places them best fit
(the fullest machine with room), the placement that frees most. Not the autoscaler's code: its
rules, written here."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

SCAN_INTERVAL = 10.0
THRESHOLD = 0.5
UNNEEDED_TIME = 600.0
DELAY_AFTER_ADD = 600.0


@dataclass(frozen=True)
class Node:
    """What the autoscaler reads of a machine: what it has, and its pods' requests (cpu, memory)."""

    cpus: float
    memory: float
    pods: Mapping[Hashable, tuple[float, float]]

    def requested(self) -> float:
        """The larger of its pods' cpu and memory requests over what it has."""
        return max(sum(c for c, _ in self.pods.values()) / self.cpus, sum(m for _, m in self.pods.values()) / self.memory)


def unneeded(nodes: Mapping[str, Node], candidate: Callable[[str], bool] = lambda _: True
             ) -> list[tuple[str, dict[Hashable, str]]]:
    """One scan's unneeded nodes, the least requested first, each with where its pods would go:
    each pod, best fit, on the fullest other node that holds it; the pods of the nodes found before
    it count as moved already, and no pod goes to a node found unneeded. `candidate`: the nodes
    that may be removed (the others are only where pods go)."""
    free = {n: [v.cpus - sum(c for c, _ in v.pods.values()), v.memory - sum(m for _, m in v.pods.values())]
            for n, v in nodes.items()}
    found: list[tuple[str, dict[Hashable, str]]] = []
    removed: set[str] = set()
    for name in sorted(nodes, key=lambda n: (nodes[n].requested(), n)):
        node = nodes[name]
        if not node.pods or node.requested() >= THRESHOLD or not candidate(name):
            continue
        room = {o: list(free[o]) for o in nodes if o != name and o not in removed}
        place: dict[Hashable, str] = {}
        for key, (c, m) in sorted(node.pods.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0])):
            fits = [o for o, (fc, fm) in room.items() if fc >= c and fm >= m]
            if not fits:
                break
            o = min(fits, key=lambda o: (room[o][0], room[o][1], o))
            room[o][0] -= c
            room[o][1] -= m
            place[key] = o
        if len(place) < len(node.pods):
            continue
        free.update(room)
        removed.add(name)
        found.append((name, place))
    return found


@dataclass
class ClusterAutoscaler:
    """The scale-down of one node group over time (the timers)."""

    slots: int  # tasks a machine holds (each requests 1 / slots of its cpu and memory)
    unneeded_since: dict[str, float] = field(default_factory=dict)
    last_add: float = float("-inf")
    last_scan: float = float("-inf")

    def grew(self, now: float) -> None:
        """The node group took a machine (its scale-up)."""
        self.last_add = now

    def scan(self, now: float, machines: Mapping[str, int]) -> str | None:
        """One scan over the group's machines (name -> tasks on it): the machine to drain now, or
        None. Empty machines are not the caller's to keep (they go at once; the caller returns
        them), so only machines with tasks are considered."""
        self.last_scan = now
        nodes = {m: Node(self.slots, self.slots, {i: (1, 1) for i in range(n)}) for m, n in machines.items()}
        found = [name for name, _ in unneeded(nodes)]
        self.unneeded_since = {m: self.unneeded_since.get(m, now) for m in found}
        if now < self.last_add + DELAY_AFTER_ADD:
            return None
        ripe = [m for m in found if now - self.unneeded_since[m] >= UNNEEDED_TIME - 1e-9]
        if not ripe:
            return None
        victim = ripe[0]  # the first found: the least requested of those unneeded long enough
        del self.unneeded_since[victim]
        return victim
