"""Compaction within a round's move budget: the machines cheapest to free first, across every
group, until the budget is spent (issue #36; the descheduler's maxNoOfPodsToEvictTotal, for a
planner that frees machines).

Where the per-group solve (compaction.py) frees as many machines as each group can, whatever the
moves, a round with a budget asks which machines give the most freed per move. A machine's cost is
the moves that empty it: one a task on it, each onto the best fit among the other machines of its
group (entitlement, MSB) that stay held, those holding more tasks than the machine drained first
(a machine as cheap to free is not filled: it would cost a move more), and one more for a task
that fits nowhere as things stand but does once a small task of a target machine moves to a third
machine of the group (an ejection: the make-room move the solver finds, one deep). The machines
are taken cheapest first (fewest moves; of those as cheap, a hot MSB's first, whose drain cools it
and so spares a hotspot move; then least reserved), their cost computed afresh when their turn
comes (earlier drains fill the targets), until the next one would pass the budget. A move keeps
what every compaction move keeps (compaction.py): its dc, its rack when its job spreads over
racks, room for what it reserves, no machine made hot, the job's churn budget; a task moves at
most once a round.

A task may also go to a machine of the entitlement in another MSB of its dc where that MSB stays
below the hot line and the job's spread is kept (the target MSB held fewer of the job's tasks than
the source: the rule of the hotspot moves, goals.py). Such a target is a fallback, taken when the
task fits nowhere in its own MSB, except for a machine of an MSB above the hot line: there it is
tried first, so that a drain there cools it too (the moves that free a machine of a hot MSB are
then moves a hotspot would have made). `reserve` keeps back the moves the cooling still needs
(CoolingLeft): a round with a budget drains with what the cooling leaves, cools, then drains
again with the rest (plan.py)."""

from __future__ import annotations

import heapq

from controlplane.rebalancer.board import Board, Key, Planned

EJECT_TARGETS = 8  # machines of the group, closest to holding a task that fits nowhere, tried for an ejection
EJECT_UPTO = 4  # tasks a machine may hold for a drain of it to try ejections (a dearer one is not worth them)


class _Trial:
    """A drain being tried: the room the moves so far take and give, before any is made."""

    def __init__(self, board: Board, source: str, freed: set[str]):
        self.b, self.source, self.freed = board, source, freed
        # the machines its tasks may go to: the group's others that stay held
        self.group = [mid for mid in board.in_group[board.group_of[source]]
                      if mid != source and mid not in freed and board.holds(mid)]
        self.dc: dict[str, int] = {}  # machine -> millicores the trial's moves add
        self.dm: dict[str, int] = {}
        self.du: dict[str, int] = {}
        self.moves: list[tuple[Key, str]] = []
        self.spent: dict[str, int] = {}  # job -> moves of the trial
        ent, dc, msb = board.group_of[source]
        self.ent, self.msb = ent, (dc, msb)
        self._cross: list[str] | None = None  # the other MSBs' machines (cross(), made when first asked)
        self.dmsb: dict[tuple[str, str], int] = {}  # MSB -> millicores measured the trial's moves add
        self.djob: dict[tuple[str, tuple[str, str]], int] = {}  # (job, MSB) -> tasks the trial adds

    def cross(self) -> list[str]:
        """The entitlement's machines in the other MSBs of the dc that stay held."""
        if self._cross is None:
            b = self.b
            self._cross = [mid for other in sorted(b.msb_set.get((self.ent, self.msb[0]), ())) if other != self.msb
                           for mid in b.in_group[(self.ent, *other)] if mid not in self.freed and b.holds(mid)]
        return self._cross

    def hot(self) -> bool:
        """Whether the source's MSB is above the hot line, the trial's moves counted."""
        b = self.b
        return b.msb_used.get(self.msb, 0) + self.dmsb.get(self.msb, 0) > b.msb_limit * b.msb_cpus.get(self.msb, 0)

    def room(self, mid: str) -> tuple[int, int, float]:
        b = self.b
        return (b.free_cpus[mid] - self.dc.get(mid, 0), b.free_mem[mid] - self.dm.get(mid, 0),
                b.hot_limit(mid) - b.used[mid] - self.du.get(mid, 0))

    def fits(self, key: Key, mid: str) -> bool:
        b = self.b
        t = b.tasks[key]
        c, m, u = self.room(mid)
        if c < t.cpus or m < t.memory_mb or u < t.used:
            return False
        to, at = b.msb_of(mid), b.msb_of(b.where[key])
        if to == at:
            return True
        if not b.stays_cool(to, self.dmsb.get(to, 0) + t.used):
            return False
        counts = b.job_msb[t.job]
        return not t.spreads_msb or (counts[to] + self.djob.get((t.job, to), 0)
                                     < counts[at] + self.djob.get((t.job, at), 0))

    def may_move(self, key: Key) -> bool:
        b = self.b
        return b.movable(key) and b.budget[key[0]] - self.spent.get(key[0], 0) > 0

    def targets(self, key: Key, exclude: str = "") -> list[str]:
        b = self.b
        here = b.where[key]
        if not b.tasks[key].keep_rack:
            return [mid for mid in self.group if mid != here and mid != exclude]
        rack = b.machines[here].rack
        return [mid for mid in self.group if mid != here and mid != exclude and b.machines[mid].rack == rack]

    def best_fit(self, key: Key, among: list[str]) -> str | None:
        fits = [mid for mid in among if self.fits(key, mid)]
        few = len(self.b.on[self.source])
        return min(fits, key=lambda mid: (len(self.b.on[mid]) <= few, *self.room(mid)[:2], mid), default=None)

    def add(self, key: Key, mid: str) -> None:
        t = self.b.tasks[key]
        here = self.b.where[key]
        for d, v in ((self.dc, t.cpus), (self.dm, t.memory_mb), (self.du, t.used)):
            d[mid] = d.get(mid, 0) + v
            if here != self.source:  # an ejected task gives its machine its room back
                d[here] = d.get(here, 0) - v
        self.moves.append((key, mid))
        self.spent[key[0]] = self.spent.get(key[0], 0) + 1
        to, at = self.b.msb_of(mid), self.b.msb_of(here)
        if to != at:
            for msb, sign in ((to, 1), (at, -1)):
                self.dmsb[msb] = self.dmsb.get(msb, 0) + sign * t.used
                self.djob[(t.job, msb)] = self.djob.get((t.job, msb), 0) + sign

    def eject_for(self, key: Key, among: list[str]) -> bool:
        """Make room for `key` on one of `among` by moving one task off it to a third machine."""
        b = self.b
        t = b.tasks[key]
        moved = {k for k, _ in self.moves}

        def short(mid: str) -> tuple[int, int, float]:
            c, m, u = self.room(mid)
            return max(0, t.cpus - c), max(0, t.memory_mb - m), max(0.0, t.used - u)

        closest = sorted(among, key=lambda mid: (short(mid)[0] + short(mid)[1] // 4, mid))[:EJECT_TARGETS]
        for mid in closest:
            need_c, need_m, need_u = short(mid)
            others = sorted((k for k in b.on[mid] if k not in moved and k != key), key=lambda k: (b.tasks[k].cpus, k))
            for e in others:
                et = b.tasks[e]
                if et.cpus < need_c or et.memory_mb < need_m or et.used < need_u or not self.may_move(e):
                    continue
                if e[0] == key[0] and b.budget[key[0]] - self.spent.get(key[0], 0) < 2:
                    continue
                to = self.best_fit(e, self.targets(e, exclude=mid))
                if to is None:
                    continue
                self.add(e, to)
                if not self.fits(key, mid):  # a bug: e covered the shortfall in cpus, memory and use
                    raise AssertionError(f"ejecting {e} from {mid} made no room for {key}")
                self.add(key, mid)
                return True
        return False


def drain(board: Board, source: str, freed: set[str]) -> list[tuple[Key, str]] | None:
    """The moves that empty `source` (each task, largest first, onto its best fit; an ejection when
    none has room), or None when it cannot be emptied this round."""
    b = board
    trial = _Trial(b, source, freed)
    for key in sorted(b.on[source], key=lambda k: (-b.tasks[k].cpus, -b.tasks[k].memory_mb, k)):
        if not trial.may_move(key):
            return None
        among = trial.targets(key)
        # out of an MSB above the hot line first (the move cools it), else a fallback
        cross = not b.tasks[key].keep_rack
        hot = cross and trial.hot()
        mid = trial.best_fit(key, trial.cross()) if hot else None
        if mid is None:
            mid = trial.best_fit(key, among)
        if mid is None and cross and not hot:
            mid = trial.best_fit(key, trial.cross())
        if mid is not None:
            trial.add(key, mid)
        elif len(b.on[source]) > EJECT_UPTO or not trial.eject_for(key, among):
            return None
    return trial.moves


class CoolingLeft:
    """The fewest moves that bring each MSB above the hot line down to it: its hottest movable tasks
    until their use covers its excess (where they could go left out: a lower bound; the bench's
    least_cooling() is this on the region as it starts). An MSB's figure is kept until its measured
    load changes."""

    def __init__(self, board: Board):
        self.b = board
        self.known: dict[tuple[str, str], tuple[int, int]] = {}  # MSB -> (its use, its moves)

    def __call__(self) -> int:
        b = self.b
        n = 0
        for msb, cap in b.msb_cpus.items():
            used = b.msb_used.get(msb, 0)
            if used <= b.msb_limit * cap:
                continue
            seen = self.known.get(msb)
            if seen is None or seen[0] != used:
                excess, k = used - b.msb_limit * cap, 0
                for u in sorted((b.tasks[key].used for mid in b.msb_machines.get(msb, ()) for key in b.on[mid]
                                 if not b.tasks[key].keep_rack and b.movable(key)), reverse=True):
                    if excess <= 0:
                        break
                    excess -= u
                    k += 1
                seen = self.known[msb] = (used, k)
            n += seen[1]
        return n


def cheapest(board: Board, budget: int, reserve=None) -> tuple[list[Planned], set[str]]:
    """Machines freed cheapest first across every group, within `budget` moves less what
    `reserve()` asks to keep back as things stand: the moves made on the board, and the machines
    they free."""
    heap = []
    for mids in board.in_group.values():
        for mid in mids:
            if board.holds(mid) and board.clear(mid) and board.on[mid]:
                m = board.machines[mid]
                msb = (m.dc, m.msb)
                hot = board.msb_used.get(msb, 0) > board.msb_limit * board.msb_cpus.get(msb, 0)
                heap.append((len(board.on[mid]), not hot, m.cpus - board.free_cpus[mid], mid))
    heapq.heapify(heap)
    out: list[Planned] = []
    freed: set[str] = set()
    spent = 0
    limit = budget - (reserve() if reserve is not None else 0)  # anew after each drain made
    while heap and spent < budget:
        cost, cool, reserved, mid = heapq.heappop(heap)
        if spent + cost > limit:
            continue  # a cheaper one may still fit what is left
        if not board.on[mid] or not board.holds(mid) or mid in freed:
            continue
        moves = drain(board, mid, freed)
        if moves is None:
            continue
        if len(moves) > cost:
            heapq.heappush(heap, (len(moves), cool, reserved, mid))  # dearer than it looked: its turn again at its cost
            continue
        if spent + len(moves) > limit:
            continue
        for key, target in moves:
            source = board.where[key]
            why = (f"compaction: frees {source} ({len(moves)} move(s))" if source == mid else
                   f"compaction: makes room on {source} for a task of {mid}, being freed")
            out.append(board.move(key, target, "compaction", why))
        freed.add(mid)
        spent += len(moves)
        if reserve is not None:
            limit = budget - reserve()
    return out, freed

