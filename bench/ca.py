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

from collections.abc import Mapping
from dataclasses import dataclass, field

SCAN_INTERVAL = 10.0
THRESHOLD = 0.5
UNNEEDED_TIME = 600.0
DELAY_AFTER_ADD = 600.0


@dataclass
class ClusterAutoscaler:
    slots: int  # tasks a machine holds (each requests 1 / slots of its cpu and memory)
    unneeded_since: dict[str, float] = field(default_factory=dict)
    last_add: float = float("-inf")
    last_scan: float = float("-inf")

    def grew(self, now: float) -> None:
        """The node group took a machine (its scale-up)."""
        self.last_add = now

    def due(self, now: float) -> bool:
        return now >= self.last_scan + SCAN_INTERVAL - 1e-9

    def scan(self, now: float, machines: Mapping[str, int]) -> str | None:
        """One scan over the group's machines (name -> tasks on it): the machine to drain now, or
        None. Empty machines are not the caller's to keep (they go at once; the caller returns
        them), so only machines with tasks are considered."""
        self.last_scan = now
        room = {m: self.slots - n for m, n in machines.items()}
        unneeded: list[str] = []
        # the least utilized first: the nodes whose pods are fewest to place elsewhere
        for m in sorted(machines, key=lambda m: (machines[m], m)):
            n = machines[m]
            if n == 0 or n / self.slots >= THRESHOLD:
                continue
            others = {o: r for o, r in room.items() if o != m and o not in unneeded and r > 0}
            if sum(others.values()) < n:
                continue
            # best fit: each pod on the fullest machine with room (pods here are alike)
            for _ in range(n):
                o = min(others, key=lambda o: (others[o], o))
                others[o] -= 1
                room[o] -= 1
                if not others[o]:
                    del others[o]
            unneeded.append(m)
        self.unneeded_since = {m: self.unneeded_since.get(m, now) for m in unneeded}
        if now < self.last_add + DELAY_AFTER_ADD:
            return None
        ripe = [m for m in unneeded if now - self.unneeded_since[m] >= UNNEEDED_TIME - 1e-9]
        if not ripe:
            return None
        victim = ripe[0]  # the first found: the least utilized of those unneeded long enough
        del self.unneeded_since[victim]
        return victim
