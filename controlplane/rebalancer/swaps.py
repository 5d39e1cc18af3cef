"""Goal 4: machine swaps with the free pool. An entitlement's machine gives all its tasks to a free
machine of the same dc and machine type, which the entitlement takes, and goes back to the pool
itself: the entitlement holds as many machines as before, in a better place.

A swap is made only when it makes one of two things better and neither worse (no job's spread,
whatever the swap is for; the free machine is in an MSB where the entitlement holds machines: one
new to it would count in the spread of each of its jobs there):
- spread: the jobs on the machine are more even over their MSBs after it (the free machine is in an
  MSB where they have fewer tasks, one where the entitlement had no room: repair, which runs
  first, uses the room there is);
- the free pool's shape: the machine's rack becomes wholly free (a whole rack for a job that wants
  one, for a rack's maintenance) while the free machine's rack was not wholly free.
Its cost, among the swaps that qualify: the tasks it moves, and the host profile switch of the
free machine (SWITCH_COST moves' worth) when the entitlement has a profile. At most MAX_SWAPS a
round; every task of the machine must be free to move (its job's churn budget, no cool-down, no
rack of its own to keep)."""

from __future__ import annotations

from collections import Counter

from controlplane.rebalancer.board import Board, Planned
from controlplane.rebalancer.score import job_excess, spread_excess

SWITCH_COST = 4  # a profile switch on the machine taken, in moves
MAX_SWAPS = 20  # a round's
MAX_TRIED = 2000  # machines a round looks at for a swap (those with the fewest tasks: the cheapest)


def swaps(board: Board) -> list[Planned]:
    if not board.pool:
        return []
    out: list[Planned] = []
    racks = {r: list(v) for r, v in board.region.racks.items()}  # rack -> [machines, free ones]
    uneven = spread_excess(board)  # (job, dc) -> tasks beyond an even spread
    by_msb: dict[tuple[str, str], list[str]] = {}  # the free machines, smallest first
    for mid, m in sorted(board.pool.items(), key=lambda kv: (kv[1].cpus, kv[1].memory_mb, kv[0])):
        by_msb.setdefault((m.dc, m.msb), []).append(mid)
    done = tried = 0
    for a in sorted(_candidates(board), key=lambda mid: (len(board.on[mid]), mid)):
        if done >= MAX_SWAPS or tried >= MAX_TRIED:
            break
        ma = board.machines[a]
        ent, src = ma.entitlement, (ma.dc, ma.msb)
        rack_a = racks.get(ma.rack, [0, 0])
        frees_rack = rack_a[0] > 0 and rack_a[1] + 1 == rack_a[0]
        keys = sorted(board.on[a])
        per_job = Counter(board.tasks[k].job for k in keys)
        spreadable = any(uneven.get((j, ma.dc), 0) > 0 for j in per_job)
        if not (frees_rack or spreadable):
            continue  # nothing a swap of this machine could make better
        tried += 1
        if any(not board.movable(k) or board.tasks[k].keep_rack for k in keys) or \
                any(board.budget[j] < n for j, n in per_job.items()):
            continue
        need_c, need_m = ma.cpus - board.free_cpus[a], ma.memory_mb - board.free_mem[a]
        used = board.used[a]
        best = None
        mine = board.msb_set.get((ent, ma.dc), set())
        for dst, free in by_msb.items():
            if dst[0] != ma.dc or not free or dst not in mine:
                continue  # (an MSB new to the entitlement would count in each of its jobs' spread there)
            if dst != src and not board.stays_cool(dst, used):
                continue  # not into a hot MSB
            # how much more even its jobs' spread gets there (-1: a job's less even, whatever
            # the swap is for)
            spread = _spread_gain(board, a, dst, per_job)
            if spread < 0 or (spread == 0 and not frees_rack):
                continue
            for b in free:
                mb = board.pool[b]
                if mb.type != board.region.types.get(ent, mb.type) or mb.cpus < need_c or mb.memory_mb < need_m \
                        or used > board.hot * mb.cpus:
                    continue
                rack_b = racks.get(mb.rack, [0, 0])
                shape = int(frees_rack and mb.rack != ma.rack) - int(rack_b[0] > 0 and rack_b[0] == rack_b[1])
                if shape < 0 or (spread == 0 and shape == 0):
                    continue
                cost = len(keys) + (SWITCH_COST if board.region.profiles.get(ent) else 0)
                cand = (-spread, -shape, cost, b)
                if best is None or cand < best:
                    best = cand
                break  # the smallest free machine of this MSB that qualifies
        if best is None:
            continue
        spread, b = -best[0], best[3]
        mb = board.pool[b]
        why = (f"swaps: {a} goes back to the free pool and {ent} takes {b} ({mb.msb}, {mb.rack}) for it: "
               + (f"its jobs' spread over MSBs {spread} task(s) better" if spread else f"rack {ma.rack} wholly free"))
        by_msb[(mb.dc, mb.msb)].remove(b)
        board.take(b, ent)
        for k in keys:
            out.append(board.move(k, b, "swaps", why))
        racks.setdefault(ma.rack, [0, 0])[1] += 1
        racks.setdefault(mb.rack, [0, 0])[1] -= 1
        for j in per_job:  # what the swap changed
            uneven[(j, ma.dc)] = job_excess(board, j, ent, ma.dc)
        done += 1
    return out


def _candidates(board: Board) -> list[str]:
    return [mid for mid in board.machines if board.on[mid] and board.clear(mid) and mid not in board.taken]


def _spread_gain(board: Board, a: str, dst: tuple[str, str], per_job: Counter) -> int:
    """How much more even the jobs of machine a are over their MSBs once its tasks run on a free
    machine of MSB dst (the entitlement holding it, and no longer a), by the checker's measure
    (score.job_excess); -1 when any of them would be less even: a swap that evens one job never
    makes another's spread worse."""
    ma = board.machines[a]
    src = (ma.dc, ma.msb)
    if src == dst:
        return 0
    ent = ma.entitlement
    spreads = {board.tasks[k].job for k in board.on[a] if board.tasks[k].spreads_msb and not board.tasks[k].keep_rack}
    jobs = [(job, n) for job, n in sorted(per_job.items()) if job in spreads]
    before = {job: job_excess(board, job, ent, ma.dc) for job, _ in jobs}
    # as if taken and moved (dst is one of the entitlement's MSBs already: swaps() takes no other),
    # all put back below: no copy of the counts
    for job, n in jobs:
        board.job_msb[job][src] -= n
        board.job_msb[job][dst] += n
    try:
        after = {job: job_excess(board, job, ent, ma.dc) for job, _ in jobs}
    finally:
        for job, n in jobs:
            board.job_msb[job][src] += n
            board.job_msb[job][dst] -= n
    if any(after[job] > before[job] for job, _ in jobs):
        return -1
    return sum(before[job] - after[job] for job, _ in jobs)
