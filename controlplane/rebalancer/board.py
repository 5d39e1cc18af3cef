"""The region as a round's moves change it: where each task runs, each machine's free room and
measured cpu, each MSB's measured cpu, and each job's tasks per MSB. The goals run in order on one
board, so each sees the moves of those before it; a task moves at most once a round, never while
it cools down from a move of an earlier round, and a job's moves stay within its churn budget."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from controlplane.rebalancer.view import Machine, Region, Task

Key = tuple[str, int]  # (job, index)
HOT_MACHINE = 0.80  # a machine whose measured cpu is above this share of its cores is hot
MSB_MARGIN = 0.05  # an MSB whose load is above the region's mean by more than this share is hot


def churn_budget(n: int, fraction: float) -> int:
    return max(1, math.ceil(n * fraction))


@dataclass(frozen=True)
class Planned:
    job: str
    index: int
    source: str
    target: str
    goal: str  # repair, hotspots, compaction
    why: str


class Board:
    def __init__(self, region: Region, churn: float = 0.25, cooling: frozenset[Key] | set[Key] = frozenset(),
                 hot: float = HOT_MACHINE, margin: float = MSB_MARGIN):
        self.region, self.hot, self.margin = region, hot, margin
        self.cooling = cooling
        self.machines: dict[str, Machine] = {}
        self.group_of: dict[str, tuple[str, str, str]] = {}
        self.in_group: dict[tuple[str, str, str], list[str]] = {}
        self.tasks: dict[Key, Task] = {}
        self.where: dict[Key, str] = {}
        self.on: dict[str, set[Key]] = {}
        self.free_cpus: dict[str, int] = {}
        self.free_mem: dict[str, int] = {}
        self.used: dict[str, int] = {}
        self.msb_used: dict[tuple[str, str], int] = {k: 0 for k in region.msb_cpus}
        self.msb_cpus = dict(region.msb_cpus)
        self.job_msb: dict[str, Counter] = {}
        per_job: Counter = Counter()
        self.msb_machines: dict[tuple[str, str], list[str]] = {}  # (dc, msb) -> the machines planned there
        self.msb_set: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (entitlement, dc) -> its MSBs there
        for g in region.groups:
            gk = (g.entitlement, g.dc, g.msb)
            self.in_group[gk] = [m.id for m in g.machines]
            self.msb_set.setdefault((g.entitlement, g.dc), set()).add((g.dc, g.msb))
            self.msb_machines.setdefault((g.dc, g.msb), []).extend(m.id for m in g.machines)
            for m in g.machines:
                self.machines[m.id] = m
                self.group_of[m.id] = gk
                self.on[m.id] = set()
                self.free_cpus[m.id] = m.cpus - m.fixed_cpus
                self.free_mem[m.id] = m.memory_mb - m.fixed_memory_mb
                self.used[m.id] = 0
            for t in g.tasks:
                key = (t.job, t.index)
                self.tasks[key] = t
                self._put(key, t.machine, +1)
                per_job[t.job] += 1
        self.budget = {job: churn_budget(n, churn) for job, n in per_job.items()}
        self.moves: dict[Key, Planned] = {}
        self.max_moves: int | None = None  # the round's move budget (plan.py); None: the jobs' budgets only
        self.pool: dict[str, Machine] = {m.id: m for m in region.pool}  # free machines a swap may take
        self.taken: dict[str, str] = {}  # free machine -> the entitlement a swap gives it to
        # the region's mean load, and the line above it that makes an MSB hot: moves do not change
        # what is used nor the MSBs' cores, so both hold for the round
        cap = sum(self.msb_cpus.values())
        self.mean = sum(self.msb_used.values()) / cap if cap else 0.0
        self.msb_limit = self.mean * (1 + margin)

    # -- reading -------------------------------------------------------------------------------

    def msb_of(self, mid: str) -> tuple[str, str]:
        m = self.machines[mid]
        return m.dc, m.msb

    def load(self, msb: tuple[str, str]) -> float:
        cap = self.msb_cpus.get(msb, 0)
        return self.msb_used.get(msb, 0) / cap if cap else 0.0

    def stays_cool(self, msb: tuple[str, str], used: int) -> bool:
        """Whether the MSB stays at or below the hot line with `used` more millicores measured."""
        return self.msb_used.get(msb, 0) + used <= self.msb_limit * self.msb_cpus.get(msb, 0)

    def holds(self, mid: str) -> bool:
        """Whether the machine holds something (else it goes back to the free pool)."""
        m = self.machines[mid]
        return bool(self.on[mid]) or m.pinned or m.fixed_cpus > 0 or m.fixed_memory_mb > 0

    def clear(self, mid: str) -> bool:
        """Whether nothing on the machine is fixed to it (what may empty it are its tasks' moves)."""
        m = self.machines[mid]
        return not m.pinned and not m.fixed_cpus and not m.fixed_memory_mb

    def hot_limit(self, mid: str) -> float:
        """The measured cpu a machine may reach by moves onto it: the hot share of its cores, or
        what it uses now if it is above that already (a move never makes a hot machine hotter)."""
        return max(self.hot * self.machines[mid].cpus, self.used[mid])

    def movable(self, key: Key) -> bool:
        return (key not in self.moves and key not in self.cooling and self.budget.get(key[0], 0) > 0
                and (self.max_moves is None or len(self.moves) < self.max_moves))

    def fits(self, key: Key, mid: str) -> bool:
        t = self.tasks[key]
        return (self.free_cpus[mid] >= t.cpus and self.free_mem[mid] >= t.memory_mb
                and self.used[mid] + t.used <= self.hot_limit(mid))

    def best_fit(self, key: Key, candidates: list[str]) -> str | None:
        """The machine the allocator would pick among `candidates`: the least free room that
        still holds the task (then the id), here also below the hot share once it is there. Never
        one that holds nothing: it goes back to the free pool, and a move onto it would take it
        back (a round's drains may have just emptied it)."""
        here = self.where[key]
        fits = [mid for mid in candidates if mid != here and self.holds(mid) and self.fits(key, mid)]
        return min(fits, key=lambda mid: (self.free_cpus[mid], self.free_mem[mid], mid), default=None)

    # -- changing ------------------------------------------------------------------------------

    def _put(self, key: Key, mid: str, sign: int) -> None:
        t = self.tasks[key]
        if sign > 0:
            self.where[key] = mid
            self.on[mid].add(key)
        else:
            self.on[mid].discard(key)
        self.free_cpus[mid] -= sign * t.cpus
        self.free_mem[mid] -= sign * t.memory_mb
        self.used[mid] += sign * t.used
        msb = self.msb_of(mid)
        self.msb_used[msb] = self.msb_used.get(msb, 0) + sign * t.used
        counts = self.job_msb.setdefault(t.job, Counter())
        counts[msb] += sign

    def move(self, key: Key, target: str, goal: str, why: str) -> Planned:
        source = self.where[key]
        self._put(key, source, -1)
        self._put(key, target, +1)
        self.budget[key[0]] -= 1
        p = Planned(key[0], key[1], source, target, goal, why)
        self.moves[key] = p
        return p

    def take(self, mid: str, entitlement: str) -> None:
        """A free machine joins the entitlement (a swap): it is planned on from now on."""
        m = replace(self.pool.pop(mid), entitlement=entitlement)
        gk = (entitlement, m.dc, m.msb)
        self.machines[mid] = m
        self.group_of[mid] = gk
        if gk not in self.in_group:
            self.in_group[gk] = []
            self.msb_set.setdefault((entitlement, m.dc), set()).add((m.dc, m.msb))
        self.in_group[gk].append(mid)
        self.msb_machines.setdefault((m.dc, m.msb), []).append(mid)
        self.on[mid] = set()
        self.free_cpus[mid], self.free_mem[mid], self.used[mid] = m.cpus, m.memory_mb, 0
        self.taken[mid] = entitlement

    def held(self) -> set[str]:
        """The machines that hold something after the moves (the others go back to the free pool)."""
        return {mid for mid in self.machines if self.holds(mid)}
