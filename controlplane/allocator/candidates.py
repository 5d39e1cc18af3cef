"""The candidate bins of one allocation, and the pick among them.

Per bin that holds tasks of this job ("occupied") it keeps the best-fitting machine of the
entitlement and of the free pool that still has room for one task; after a pick only that bin is
looked at again (room only shrinks during one allocation, and only where a task went).

Why the other bins are grouped: a bin's score depends only on this job's task counts in it and in
its ancestors at the preferences' levels. Bins that hold none of the job's tasks ("quiet" bins)
therefore score alike when they share their deepest ancestor (at a preference level) that holds
tasks, or, while none does, their parent bin (the bin of the finest preference coarser than the
candidate level). Only the best-fitting quiet bin of each such class is scored: a few dozen
scores per task, not one per rack or msb.

Quiet bins are found through the index's msb buckets, never one by one: an msb's best quiet
candidate is its best-fitting machine outside the occupied bins (for rack bins, the msb bucket
holds every rack of the msb). Each class keeps its msbs in a heap by that candidate; an msb looks
again when its candidate's rack becomes occupied, and leaves its class for one of its own when it
gets its first task (with racks as bins and msbs a preference level: its quiet racks now score
by its count). So a job costs one pass over the msbs of its machine type, rack preference or not.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from .index import Entry, Path, first_fit
from .model import EPSILON, LEVELS, Machine
from .preferences import BinCounts, Scorer
from .request import Requirements
from .snapshot import Snapshot
from .overlay import Overlay

OWNED, FREE = 0, 1  # tiers: within a bin, the entitlement's machines come before the free pool
MSB = LEVELS.index("msb") + 1  # the length of an msb's path

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
    def __init__(self, snapshot: Snapshot, req: Requirements, overlay: Overlay, occupied: set[Path],
                 counts: BinCounts) -> None:
        self.req = req
        self.scorer = Scorer(req.preferences, counts)  # this job's tasks per bin, as the picks add them
        self.overlay = overlay
        self.machines = snapshot.machines
        ent = req.entitlement
        index = snapshot.index
        self.owned = index.bins(req.level, req.machine_type, ent.name)
        self.pool = index.bins(req.level, req.machine_type, None)
        self.owned_msb = index.bins("msb", req.machine_type, ent.name)
        self.pool_msb = index.bins("msb", req.machine_type, None)
        self.quota_open = overlay.held() < ent.quota
        self.reserve = ent.reserve  # free machines it leaves in each dc (opportunistic entitlements)
        self.closed: set[str] = set()  # dcs whose free machines it may no longer take (their reserve reached)
        self.occupied = occupied  # bins holding tasks of this job: scored one by one
        # Racks as bins: a quiet candidate is no machine of an occupied rack. Msbs as bins: an
        # occupied msb has no quiet candidate (and every consumed machine is in an occupied bin).
        self.fine = req.level != "msb"
        self.skip = _InOccupiedRack(self.machines, occupied) if self.fine else ()
        pref_levels = {LEVELS.index(p.property) for p in req.preferences}
        level = LEVELS.index(req.level)
        # the class of a quiet msb: its path cut to the finest preference coarser than the bins
        # (than msbs, when msbs are a preference level and racks the bins: see `_class_of`)
        self.by_msb = self.fine and MSB - 1 in pref_levels
        coarser = [lv for lv in pref_levels if lv < (MSB - 1 if self.by_msb else level)]
        self.parent_depth = max(coarser, default=0) + 1
        self.msbs_with_tasks = {p[:MSB] for p in occupied} if self.by_msb else set()
        # Every preference a spread, the bins' own level among them: an occupied bin counts at least
        # one task at that level, where a quiet bin of its class counts none and the same as it at
        # every coarser level a preference uses (the class is cut at the finest of those). The
        # class's candidate then scores strictly higher however the scores are normalised, so such
        # an occupied bin is not scored while its class has a candidate; only its count at the
        # bins' level still bounds that level's normalisation (Scorer.best's `highest`), the
        # coarser levels' being its class candidate's. (Issue #38: the occupied bins, scored at
        # every task, were most of the pick at 1,000,000 machines.)
        terms = [pref for pref in req.preferences if pref.weight != 0]
        self.dominated = bool(terms) and all(pref.strategy == "spread" for pref in terms) and \
            any(pref.property == req.level for pref in terms)
        self.in_bin = counts.at(req.level).get if self.dominated else None
        self.bin_depth = level + 1
        self.best: dict[Path, Key] = {}
        for p in occupied:
            if req.dc_allows(p[1]):
                self._refresh(p)
        self._group_quiet()

    def _pool_open(self, dc: str) -> bool:
        """Whether the dc's free machines are candidates: quota left, and free machines beyond
        the reserve."""
        return self.quota_open and (not self.reserve or self.overlay.pool_left(self.req.machine_type, dc) > self.reserve)

    def _class_of(self, msb: Path) -> Path:
        if msb in self.msbs_with_tasks:
            return msb  # its quiet racks score by its own task count
        return msb[: self.parent_depth]

    def _refresh(self, p: Path) -> None:
        """The best candidate of an occupied bin."""
        r, overlay = self.req.request, self.overlay
        owned = first_fit(self.owned.get(p, ()), r.cpus, r.memory_mb, overlay.consumed)
        for mid in overlay.touched_in(p):  # every touched machine is the entitlement's by now
            c, mem = overlay.free(mid)
            if c >= r.cpus - EPSILON and mem >= r.memory_mb and (owned is None or (c, mem, mid) < owned):
                owned = (c, mem, mid)
        if owned is not None:
            self.best[p] = (OWNED, owned)
        elif self._pool_open(p[1]) and (free := first_fit(self.pool.get(p, ()), r.cpus, r.memory_mb, overlay.consumed)):
            self.best[p] = (FREE, free)
        else:
            self.best.pop(p, None)  # for good: room only shrinks during one allocation

    def _quiet_in(self, msb: Path) -> Quiet | None:
        """The best candidate of the msb outside occupied bins, with its bin."""
        r = self.req.request
        skip = self.skip if self.occupied else ()
        e = first_fit(self.owned_msb.get(msb, ()), r.cpus, r.memory_mb, skip)
        if e is not None:
            key = (OWNED, e)
        elif self._pool_open(msb[1]) and (e := first_fit(self.pool_msb.get(msb, ()), r.cpus, r.memory_mb, skip)):
            key = (FREE, e)
        else:
            return None
        return key, (self.machines[e[2]].path(self.req.level) if self.fine else msb), msb

    def _group_quiet(self) -> None:
        """Every msb's quiet candidate in its class: the one pass over the msbs of the type."""
        quiet: dict[Path, list[Quiet]] = {}
        msbs = self.owned_msb.keys() | self.pool_msb.keys() if self.quota_open else self.owned_msb.keys()
        if self.req.dcs:
            msbs = [m for m in msbs if self.req.dc_allows(m[1])]
        if not self.fine:
            msbs = [m for m in msbs if m not in self.occupied]
        quiet_in, class_of = self._quiet_in, self._class_of
        for msb in msbs:
            if (q := quiet_in(msb)) is not None:
                quiet.setdefault(class_of(msb), []).append(q)
        for heap in quiet.values():
            heapify(heap)
        self.quiet = quiet

    def pick(self) -> str | None:
        """The machine for the next task: best score, then fewest of the job's tasks at the finest
        spread level (preferences.bin_ties), then own machines first, then best fit."""
        best, occupied, class_of = self.best, self.occupied, self._class_of
        heads: list[Path] = []
        head_keys: list[Key] = []
        headed: set[Path] = set()  # the classes with a candidate
        for cls in list(self.quiet):
            heap = self.quiet[cls]
            # drop candidates out of date: their bin became occupied (scored above), or their msb
            # got a task and has a class of its own; an msb still in this class looks again
            while heap and (heap[0][1] in occupied or class_of(heap[0][2]) != cls):
                _, _, msb = heappop(heap)
                if self.fine and class_of(msb) == cls and (q := self._quiet_in(msb)) is not None:
                    heappush(heap, q)
            if not heap:
                del self.quiet[cls]
                continue
            key, p, _ = heap[0]
            heads.append(p)
            head_keys.append(key)
            headed.add(cls)
        highest = None
        if self.dominated and headed:
            # an occupied bin's class: its msb once that holds tasks (racks as bins, msbs a
            # preference level), else its path cut at the class's level (_class_of)
            in_bin, cut = self.in_bin, MSB if self.by_msb else self.parent_depth
            paths, highest = [], 0
            for p in occupied:
                if p in best:
                    if p[:cut] in headed:
                        if (n := in_bin(p, 0)) > highest:
                            highest = n
                    else:
                        paths.append(p)
        else:
            paths = [p for p in occupied if p in best]
        keys: list[Key] = [best[p] for p in paths]
        paths += heads
        keys += head_keys
        if not paths:
            return None
        return self.scorer.best(paths, keys, (self.bin_depth, highest) if highest else None)[1][2]

    def after_pick(self, path: Path) -> None:
        self.occupied.add(path)
        if self.quota_open and self.overlay.held() >= self.req.entitlement.quota:
            self.quota_open = False  # the free pool is closed to this entitlement from now on
            self.best = {p: k for p, k in self.best.items() if k[0] == OWNED}
            if self.by_msb:
                self.msbs_with_tasks.add(path[:MSB])
            self._group_quiet()
        elif self.by_msb and path[:MSB] not in self.msbs_with_tasks:
            msb = path[:MSB]
            self.msbs_with_tasks.add(msb)  # its entry in its old class is dropped when met
            if (q := self._quiet_in(msb)) is not None:  # a picked msb passes the dc pins
                self.quiet[msb] = [q]
        if self.reserve and self.quota_open and path[1] not in self.closed and not self._pool_open(path[1]):
            self.closed.add(path[1])  # the pick left the dc's reserve: its free machines are no candidates now
            self.best = {p: k for p, k in self.best.items() if k[0] == OWNED or p[1] != path[1]}
            self._group_quiet()
        self._refresh(path)
