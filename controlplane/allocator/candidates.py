"""The candidate bins of one allocation, and the pick among them.

Per bin (an msb, or a rack when a preference bins by rack) it keeps the best-fitting machine of
the entitlement and of the free pool that still has room for one task; after a pick only that bin
is looked at again (room only shrinks during one allocation, and only where a task went).

Why bins are grouped: a bin's score depends only on this job's task counts in it and in its
ancestors. Bins that hold none of the job's tasks ("quiet" bins) therefore score alike within
their parent bin (the bin of the finest preference coarser than the candidate level), so each
parent keeps its quiet bins in a heap by fit, and a pick scores one representative per parent plus
each bin that holds tasks: a few dozen scores per task, not one per rack of the region.
"""

from __future__ import annotations

from heapq import heapify, heappop

from .index import Entry, Path, first_fit
from .model import EPSILON, LEVELS
from .preferences import BinCounts, bin_scores
from .request import Requirements
from .snapshot import Snapshot
from .view import View

OWNED, FREE = 0, 1  # tiers: within a bin, the entitlement's machines come before the free pool

Key = tuple[int, Entry]  # (tier, entry): lower is better


class Candidates:
    def __init__(self, snapshot: Snapshot, req: Requirements, view: View, occupied: set[Path]) -> None:
        self.req = req
        self.view = view
        ent = req.entitlement
        self.owned = snapshot.index.bins(req.level, req.machine_type, ent.name)
        self.pool = snapshot.index.bins(req.level, req.machine_type, None)
        self.quota_open = view.held() < ent.quota
        level = LEVELS.index(req.level)
        coarser = [LEVELS.index(p.property) for p in req.preferences if LEVELS.index(p.property) < level]
        self.parent_depth = max(coarser, default=0) + 1
        self.occupied = occupied  # bins holding tasks of this job: scored one by one
        self.best: dict[Path, Key] = {}
        for p in set(self.owned) | set(self.pool):
            if req.dc_allows(p[1]):
                self._refresh(p)
        self._group_quiet()

    def _refresh(self, p: Path) -> None:
        r, view = self.req.request, self.view
        owned = first_fit(self.owned.get(p, ()), r.cpus, r.memory_mb, view.consumed)
        for mid in view.touched_in(p):  # every touched machine is the entitlement's by now
            c, mem = view.free(mid)
            if c >= r.cpus - EPSILON and mem >= r.memory_mb and (owned is None or (c, mem, mid) < owned):
                owned = (c, mem, mid)
        if owned is not None:
            self.best[p] = (OWNED, owned)
        elif self.quota_open and (free := first_fit(self.pool.get(p, ()), r.cpus, r.memory_mb, view.consumed)):
            self.best[p] = (FREE, free)
        else:
            self.best.pop(p, None)  # for good: room only shrinks during one allocation

    def _group_quiet(self) -> None:
        quiet: dict[Path, list[tuple[int, Entry, Path]]] = {}
        for p, (tier, entry) in self.best.items():
            if p not in self.occupied:
                quiet.setdefault(p[: self.parent_depth], []).append((tier, entry, p))
        for heap in quiet.values():
            heapify(heap)
        self.quiet = quiet

    def pick(self, counts: BinCounts) -> str | None:
        """The machine for the next task: best score, then own machines first, then best fit."""
        paths: list[Path] = []
        keys: list[Key] = []
        for p in self.occupied:
            if p in self.best:
                paths.append(p)
                keys.append(self.best[p])
        for parent in list(self.quiet):
            heap = self.quiet[parent]
            while heap and heap[0][2] in self.occupied:  # became occupied since: scored above
                heappop(heap)
            if not heap:
                del self.quiet[parent]
                continue
            tier, entry, p = heap[0]
            paths.append(p)
            keys.append((tier, entry))
        if not paths:
            return None
        scores = bin_scores(self.req.preferences, counts, paths)
        _, (_, entry) = min(zip(scores, keys), key=lambda sk: (-sk[0], sk[1]))
        return entry[2]

    def after_pick(self, path: Path) -> None:
        self.occupied.add(path)
        if self.quota_open and self.view.held() >= self.req.entitlement.quota:
            self.quota_open = False  # the free pool is closed to this entitlement from now on
            self.best = {p: k for p, k in self.best.items() if k[0] == OWNED}
            self._group_quiet()
        self._refresh(path)
