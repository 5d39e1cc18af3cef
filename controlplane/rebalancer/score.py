"""Each goal's score on a board (before a round's moves and after them), and the rules no move may
break, checked on the result: what the plan reports, the tests assert and the benchmark counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from controlplane.rebalancer.board import Board, Key
from controlplane.rebalancer.view import SCALE


def spread_excess(board: Board) -> dict[tuple[str, str], int]:
    """Per (job, dc) of a job that spreads over MSBs: how many tasks more its fullest MSB holds
    than its emptiest, beyond one (the MSBs: those where its entitlement holds machines)."""
    ent_of: dict[str, str] = {}
    dcs: dict[str, set[str]] = {}
    for key, t in board.tasks.items():
        if t.spreads_msb and not t.keep_rack:
            mid = board.where[key]
            ent_of[t.job] = board.group_of[mid][0]
            dcs.setdefault(t.job, set()).add(board.machines[mid].dc)
    out = {}
    for job, job_dcs in dcs.items():
        for dc in job_dcs:
            n = job_excess(board, job, ent_of[job], dc)
            if n:
                out[(job, dc)] = n
    return out


def job_excess(board: Board, job: str, ent: str, dc: str) -> int:
    """spread_excess() of one job in one dc."""
    mine = board.msb_set.get((ent, dc), ())
    # the MSBs holding its tasks; any other MSB of its entitlement there holds none
    per = [c for (d, msb), c in board.job_msb[job].items() if d == dc and c > 0 and (d, msb) in mine]
    if not per:
        return 0
    low = min(per) if len(per) >= len(mine) else 0
    return max(0, max(per) - low - 1)


@dataclass(frozen=True)
class Scores:
    spread_excess: int
    hottest_msb: float  # the hottest MSB's load over the region's mean load
    hot_machines: int
    machines_held: int
    stranded_cpus: float  # cores held by entitlements and reserved by nothing
    held: frozenset[str]
    by_entitlement: dict[str, tuple[int, int, int]]  # held machines, their millicores, millicores reserved
    spread: dict[tuple[str, str], int]  # spread_excess() by (job, dc)


def scores(board: Board) -> Scores:
    mean = board.mean
    hottest = max((board.load(k) for k in board.msb_cpus), default=0.0)
    held = board.held()
    ents: dict[str, list[int]] = {}
    for mid, m in board.machines.items():
        e = ents.setdefault(m.entitlement, [0, 0, 0])
        e[2] += m.cpus - board.free_cpus[mid]
        if mid in held:
            e[0] += 1
            e[1] += m.cpus
    spread = spread_excess(board)
    return Scores(sum(spread.values()), round(hottest / mean, 3) if mean else 0.0,
                  sum(1 for mid, m in board.machines.items() if board.used[mid] > board.hot * m.cpus),
                  len(held), round(sum(e[1] - e[2] for e in ents.values()) / SCALE, 3), frozenset(held),
                  {n: (e[0], e[1], e[2]) for n, e in ents.items()}, spread)


class Before:
    """What the rules compare the result with: the board as the round found it."""

    def __init__(self, board: Board, scored: Scores):
        self.where = dict(board.where)
        self.over = {mid for mid in board.machines if board.free_cpus[mid] < 0 or board.free_mem[mid] < 0}
        self.limit = {mid: board.hot_limit(mid) for mid in board.machines}
        self.spread = scored.spread


def violations(before: Before, board: Board, after: Scores) -> list[str]:
    """Every broken rule, in words (none is the only right answer)."""
    out = []
    for mid, m in sorted(board.machines.items()):
        if mid not in before.over and (board.free_cpus[mid] < 0 or board.free_mem[mid] < 0):
            out.append(f"{mid} reserves more than it has")
        if board.used[mid] > before.limit.get(mid, board.hot * m.cpus):  # (a machine a swap took: its hot line)
            out.append(f"{mid} made hot: {board.used[mid] / m.cpus:.0%} of its cores measured")
    for (job, dc), excess in sorted(after.spread.items()):
        if excess > before.spread.get((job, dc), 0):
            out.append(f"{job}'s spread over the MSBs of {dc} made worse")
    seen: Counter[Key] = Counter()
    for key, p in board.moves.items():
        seen[key] += 1
        src, dst = board.machines[p.source], board.machines[p.target]
        t = board.tasks[key]
        if src.dc != dst.dc:
            out.append(f"{key[0]}#{key[1]} moved out of its dc")
        if t.keep_rack and src.rack != dst.rack:
            out.append(f"{key[0]}#{key[1]} moved out of its rack")
        if key in board.cooling:
            out.append(f"{key[0]}#{key[1]} moved while it cools down")
        if src.entitlement != dst.entitlement:
            out.append(f"{key[0]}#{key[1]} moved to another entitlement's machine")
        if before.where[key] != p.source:
            out.append(f"{key[0]}#{key[1]} moved twice")
    return out
