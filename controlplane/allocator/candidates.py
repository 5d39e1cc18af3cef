"""The candidate bins of one allocation, and the pick among them.

Per bin that holds tasks of this job ("occupied") it keeps the best-fitting machine of the
entitlement and of the free pool that still has room for one task; after a pick only that bin is
looked at again (room only shrinks during one allocation, and only where a task went).

Why the other bins are grouped: a bin's score depends only on this job's task counts in it and in
its ancestors. Bins that hold none of the job's tasks ("quiet" bins) therefore score alike within
their parent bin (the bin of the finest preference coarser than the candidate level), so only the
best-fitting quiet bin of each parent is scored: a few dozen scores per task, not one per rack.

Quiet bins are found through the index's msb buckets, never one by one: an msb's best quiet
candidate is its best-fitting machine outside the occupied bins (for rack bins, the msb bucket
holds every rack of the msb). Each parent keeps its msbs in a heap by that candidate; when the
candidate's rack becomes occupied the msb looks again. So a job with a rack preference costs a
pass over the msbs of its machine type, as any job does, not a refresh of every rack.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from .index import Entry, Path, first_fit
from .model import EPSILON, LEVELS, Machine
from .preferences import BinCounts, bin_scores
from .request import Requirements
from .snapshot import Snapshot
from .view import View

OWNED, FREE = 0, 1  # tiers: within a bin, the entitlement's machines come before the free pool

Key = tuple[int, Entry]  # (tier, entry): lower is better
Quiet = tuple[Key, Path, Path]  # (the candidate, its bin, the msb it was found in)


class _InOccupiedRack:
    """Machine ids in an occupied rack (a container for first_fit's skip)."""

    __slots__ = ("machines", "occupied")

    def __init__(self, machines, occupied: set[Path]) -> None:
        self.machines, self.occupied = machines, occupied

    def __contains__(self, machine_id: str) -> bool:
        m: Machine = self.machines[machine_id]
        return (m.region, m.dc, m.msb, m.rack) in self.occupied


class Candidates:
    def __init__(self, snapshot: Snapshot, req: Requirements, view: View, occupied: set[Path]) -> None:
        self.req = req
        self.view = view
        self.machines = snapshot.machines
        ent = req.entitlement
        index = snapshot.index
        self.owned = index.bins(req.level, req.machine_type, ent.name)
        self.pool = index.bins(req.level, req.machine_type, None)
        self.owned_msb = index.bins("msb", req.machine_type, ent.name)
        self.pool_msb = index.bins("msb", req.machine_type, None)
        self.quota_open = view.held() < ent.quota
        level = LEVELS.index(req.level)
        coarser = [LEVELS.index(p.property) for p in req.preferences if LEVELS.index(p.property) < level]
        self.parent_depth = max(coarser, default=0) + 1
        self.occupied = occupied  # bins holding tasks of this job: scored one by one
        # Machines a quiet candidate must not be: in a msb bin, none (an occupied msb has no quiet
        # candidate, and every consumed machine is in an occupied bin); in rack bins, the machines
        # of occupied racks.
        self.fine = req.level != "msb"
        self.skip = _InOccupiedRack(self.machines, occupied) if self.fine else ()
        self.best: dict[Path, Key] = {}
        for p in occupied:
            if req.dc_allows(p[1]):
                self._refresh(p)
        self._group_quiet()

    def _refresh(self, p: Path) -> None:
        """The best candidate of an occupied bin."""
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

    def _quiet_in(self, msb: Path) -> Quiet | None:
        """The best candidate of the msb outside occupied bins, with its bin."""
        r = self.req.request
        e = first_fit(self.owned_msb.get(msb, ()), r.cpus, r.memory_mb, self.skip)
        if e is not None:
            key = (OWNED, e)
        elif self.quota_open and (e := first_fit(self.pool_msb.get(msb, ()), r.cpus, r.memory_mb, self.skip)):
            key = (FREE, e)
        else:
            return None
        return key, (self.machines[e[2]].path(self.req.level) if self.fine else msb), msb

    def _group_quiet(self) -> None:
        quiet: dict[Path, list[Quiet]] = {}
        msbs = set(self.owned_msb) | set(self.pool_msb) if self.quota_open else self.owned_msb
        for msb in msbs:
            if self.req.dc_allows(msb[1]) and (self.fine or msb not in self.occupied):
                if (q := self._quiet_in(msb)) is not None:
                    quiet.setdefault(msb[: self.parent_depth], []).append(q)
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
            while heap and heap[0][1] in self.occupied:  # its bin became occupied since: scored above
                _, _, msb = heappop(heap)
                if self.fine and (q := self._quiet_in(msb)) is not None:  # the msb's next quiet rack
                    heappush(heap, q)
            if not heap:
                del self.quiet[parent]
                continue
            key, p, _ = heap[0]
            paths.append(p)
            keys.append(key)
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
