"""The goals before compaction, each a greedy pass over the board (board.py), in order:

1. repair: a job that spreads over MSBs with two tasks more in one MSB of a dc than in another MSB
   of that dc where its entitlement now has room (the allocator placed it so when the others were
   full): its coolest task moves from the fullest MSB to the emptiest, unless that makes it hot;
2. hotspots: an MSB (the power domain) whose measured load is above the region's mean by more than
   the margin sends its hottest tasks to the coolest MSBs of its dc; a machine whose measured cpu
   is above the hot share sends tasks to machines of its group (same entitlement and MSB) that
   stay below it.

Each move keeps what the allocator keeps, so that the allocator never undoes it and the
ReBalancer never fights a placement: the task stays in its dc (and in its rack when its job
spreads over racks), on a machine of its entitlement with room for what it reserves, picked as the
allocator picks (best fit), and a move between MSBs never makes its job's spread over MSBs worse
(the source MSB held more of the job's tasks than the target). A move never makes a machine hot,
nor an MSB hotter than the hot MSB it relieves, and never lands on a machine that holds nothing
(it would take a machine back from the free pool)."""

from __future__ import annotations

from controlplane.rebalancer.board import Board, Key, Planned


def _msbs_of(board: Board, entitlement: str, dc: str) -> list[tuple[str, str]]:
    return sorted(board.msb_set.get((entitlement, dc), ()))


def _spread_allows(board: Board, key: Key, source: tuple[str, str], target: tuple[str, str]) -> bool:
    t = board.tasks[key]
    if not t.spreads_msb:
        return True
    counts = board.job_msb[t.job]
    return counts[target] < counts[source]


def repair(board: Board) -> list[Planned]:
    out = []
    by_job: dict[str, list[Key]] = {}
    for key, t in board.tasks.items():
        if t.spreads_msb and not t.keep_rack:
            by_job.setdefault(t.job, []).append(key)
    for job, keys in sorted(by_job.items()):
        ent = board.group_of[board.where[keys[0]]][0]
        for dc in sorted({board.machines[board.where[k]].dc for k in keys}):
            msbs = _msbs_of(board, ent, dc)
            while True:
                counts = board.job_msb[job]
                if max((c for (d, _), c in counts.items() if d == dc), default=0) < 2:
                    break  # one task an MSB at most: nothing to even out
                hi = max(msbs, key=lambda k: (counts[k], k))
                lows = sorted((k for k in msbs if counts[k] <= counts[hi] - 2), key=lambda k: (counts[k], k))
                moved = None
                for lo in lows:
                    for key in sorted((k for k in keys if board.movable(k) and board.msb_of(board.where[k]) == hi),
                                      key=lambda k: board.tasks[k].used):
                        if board.tasks[key].used and not board.stays_cool(lo, board.tasks[key].used):
                            continue  # not into a hotspot
                        mid = board.best_fit(key, board.in_group[(ent, *lo)])
                        if mid is not None:
                            moved = board.move(key, mid, "repair", f"repair: {job} had {counts[hi]} tasks in "
                                               f"{hi[1]} and {counts[lo]} in {lo[1]}, where it now has room")
                            break
                    if moved:
                        break
                if moved is None:
                    break
                out.append(moved)
    return out


GIVE_UP = 200  # tasks of a hot MSB in a row that found no cooler MSB: the others will not either


def msb_hotspots(board: Board) -> list[Planned]:
    out = []
    mean, limit = board.mean, board.msb_limit
    room: dict[tuple[str, str, str], int] = {}  # a group's most free millicores on one machine (kept as moves land)
    for hot in sorted((k for k in board.msb_cpus if board.load(k) > limit), key=lambda k: (-board.load(k), k)):
        # the MSBs of its dc below the line, coolest first (their order as this MSB's pass begins)
        cools = sorted((k for k in board.msb_cpus if k[0] == hot[0] and k != hot and board.load(k) < limit),
                       key=lambda k: (board.load(k), k))
        keys = sorted((k for mid in board.msb_machines.get(hot, ()) for k in board.on[mid]),
                      key=lambda k: (-board.tasks[k].used, k))
        missed = 0
        by_ent: dict[str, list[tuple[str, str]]] = {}  # the cool MSBs where the entitlement holds machines
        for key in keys:
            if board.load(hot) <= limit or not cools or missed >= GIVE_UP:
                break
            t = board.tasks[key]
            if t.used <= 0 or t.keep_rack or not board.movable(key):
                continue
            ent = board.group_of[board.where[key]][0]
            if ent not in by_ent:
                mine = board.msb_set.get((ent, hot[0]), ())
                by_ent[ent] = [c for c in cools if c in mine]
            before = board.load(hot)
            missed += 1
            for cool in by_ent[ent]:
                if not board.stays_cool(cool, t.used):
                    continue
                gk = (ent, *cool)
                if gk not in room:
                    room[gk] = max((board.free_cpus[m] for m in board.in_group[gk]), default=0)
                if room[gk] < t.cpus or not _spread_allows(board, key, hot, cool):
                    continue
                mid = board.best_fit(key, board.in_group[gk])
                if mid is not None:
                    out.append(board.move(key, mid, "hotspots", f"hotspots: MSB {hot[1]} of {hot[0]} uses "
                                          f"{before / mean:.2f}x the region's mean; {cool[1]} "
                                          f"{board.load(cool) / mean if mean else 0:.2f}x after the move"))
                    room[gk] = max(board.free_cpus[m] for m in board.in_group[gk])
                    missed = 0
                    break
    return out


def machine_hotspots(board: Board) -> list[Planned]:
    out = []
    hot = [mid for mid, m in board.machines.items() if board.used[mid] > board.hot * m.cpus]
    for mid in sorted(hot, key=lambda mid: (-board.used[mid] / board.machines[mid].cpus, mid)):
        m = board.machines[mid]
        for key in sorted(board.on[mid], key=lambda k: (-board.tasks[k].used, k)):
            if board.used[mid] <= board.hot * m.cpus:
                break
            t = board.tasks[key]
            if t.used <= 0 or not board.movable(key):
                continue
            peers = [p for p in board.in_group[board.group_of[mid]]
                     if not t.keep_rack or board.machines[p].rack == m.rack]
            # onto a machine that stays below the hot share (not just below what it uses now)
            peers = [p for p in peers if board.used[p] + t.used <= board.hot * board.machines[p].cpus]
            target = board.best_fit(key, peers)
            if target is not None:
                share = board.used[mid] / m.cpus
                out.append(board.move(key, target, "hotspots", f"hotspots: {mid} uses {share:.0%} of its cores "
                                      f"(hot above {board.hot:.0%})"))
    return out
