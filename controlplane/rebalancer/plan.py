"""A rebalance round's plan: the goals in their order (goals.py: repair, then hotspots; then
compaction.py per group; then swaps.py) on one board, each goal's score before and after, each move with its goal
and why, in words a person reads, and the rules checked on the result (score.py).

A round with a move budget (`max_moves`, as the descheduler's maxNoOfPodsToEvictTotal) spends it in
another order: the machines cheapest to free across every group (cheapest.py), keeping back the
moves the hotspots still need (a drain out of a hot MSB cools it, so they need fewer as it goes),
then hotspots, then the cheapest machines again with what is left, then repair; no swap (each
moves a machine's tasks). A budget too small for the cooling goes to the hotspots first: a hot
MSB is a risk now."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from controlplane.rebalancer.board import HOT_MACHINE, MSB_MARGIN, Board, Key, Planned
from controlplane.rebalancer.cheapest import CoolingLeft, cheapest
from controlplane.rebalancer.compaction import TIME_LIMIT, Result, solve_group
from controlplane.rebalancer.goals import machine_hotspots, msb_hotspots, repair
from controlplane.rebalancer.score import Before, Scores, scores, violations
from controlplane.rebalancer.swaps import swaps
from controlplane.rebalancer.view import SCALE, Group, Region

# the moves a budgeted round keeps back for the hotspots: a quarter more than their lower bound
# (cheapest.CoolingLeft) and this many (the hottest tasks do not all find a cooler MSB with room)
COOLING_SLACK = 5
TOTAL_LIMIT = 8.0  # seconds the groups' solves may take in all (each group is drained first, at once)


@dataclass(frozen=True)
class Plan:
    results: tuple[Result, ...]
    moves: tuple[Planned, ...]  # in the order the goals made them
    before: Scores
    after: Scores
    violations: tuple[str, ...]
    seconds: float
    margin: float = MSB_MARGIN
    hot: float = HOT_MACHINE
    racks_free: tuple[int, int] = (0, 0)  # racks wholly in the free pool, before and after
    taken: dict[str, str] = field(default_factory=dict)  # free machines swaps take -> the entitlement
    max_moves: int | None = None  # the round's move budget (None: each job's churn budget only)

    def freed(self) -> list[str]:
        return sorted(self.before.held - self.after.held)

    def to_json(self) -> dict:
        b, a = self.before, self.after
        goals = {
            "repair": {"spread_excess": {"before": b.spread_excess, "after": a.spread_excess}},
            # (None: no cpu measured, no mean to compare with)
            "hotspots": {"hottest_msb": {"before": b.hottest_msb or None, "after": a.hottest_msb or None},
                         "hot_machines": {"before": b.hot_machines, "after": a.hot_machines}},
            "compaction": {"machines_held": {"before": b.machines_held, "after": a.machines_held},
                           "stranded_cpus": {"before": b.stranded_cpus, "after": a.stranded_cpus}},
            "swaps": {"free_racks": {"before": self.racks_free[0], "after": self.racks_free[1]},
                      "machines_swapped": {"before": 0, "after": len(self.taken)}},
        }
        ents = {}
        for name, (held, cpus, reserved) in sorted(b.by_entitlement.items()):
            held_after, cpus_after, _ = a.by_entitlement.get(name, (0, 0, 0))
            ents[name] = {"held": held, "held_after": held_after, "reserved_cpus": round(reserved / SCALE, 3),
                          "cpus": round(cpus / SCALE, 3), "cpus_after": round(cpus_after / SCALE, 3)}
        return {
            "goals": goals,
            "entitlements": ents,
            "moves": [{"job": p.job, "index": p.index, "source": p.source, "target": p.target, "goal": p.goal,
                       "why": p.why} for p in self.moves],
            "freed": self.freed(),
            "taken": dict(sorted(self.taken.items())),
            "groups": [{"entitlement": r.group.entitlement, "dc": r.group.dc, "msb": r.group.msb,
                        "machines": len(r.group.machines), "tasks": len(r.group.tasks), "status": r.status,
                        "seconds": round(r.seconds, 3)} for r in self.results],
            "violations": list(self.violations),
            "seconds": round(self.seconds, 3),
            "max_moves": self.max_moves,
            "summary": self.summary(),
        }

    def summary(self) -> list[str]:
        """The plan in words: a line a goal, in their order (compaction a line an entitlement)."""
        out = []
        by_goal: dict[str, int] = {}
        for p in self.moves:
            by_goal[p.goal] = by_goal.get(p.goal, 0) + 1
        b, a = self.before, self.after
        if self.max_moves is not None:
            out.append(f"budget: at most {self.max_moves} move(s) this round, {len(self.moves)} planned: hotspots "
                       "first, then the machines cheapest to free, then repair")
        if b.spread_excess:
            out.append(f"repair: {b.spread_excess} task(s) of jobs spread over MSBs are beyond an even spread; "
                       f"{by_goal.get('repair', 0)} move(s) leave {a.spread_excess}")
        else:
            out.append("repair: nothing to repair: no job spread over MSBs has two tasks more in one MSB of a dc "
                       "than in another")
        if b.hottest_msb > 1 + self.margin or b.hot_machines:
            out.append(f"hotspots: the hottest MSB uses {b.hottest_msb:.2f}x the region's mean cpu, "
                       f"{b.hot_machines} machine(s) above {self.hot:.0%} of their cores; "
                       f"{by_goal.get('hotspots', 0)} move(s) leave {a.hottest_msb:.2f}x and {a.hot_machines}")
        elif b.hottest_msb:
            out.append(f"hotspots: none (the hottest MSB uses {b.hottest_msb:.2f}x the region's mean cpu, "
                       f"no machine above {self.hot:.0%} of its cores)")
        else:
            out.append("hotspots: none measured: the tasks use next to no cpu, or their agents report none yet")
        compacting: dict[str, int] = {}
        for p in self.moves:
            if p.goal == "compaction":
                ent = p.job.partition("/")[0]
                compacting[ent] = compacting.get(ent, 0) + 1
        for name, (held, cpus, reserved) in sorted(b.by_entitlement.items()):
            n = held - a.by_entitlement.get(name, (0, 0, 0))[0]
            moves = compacting.get(name, 0)
            if n:
                out.append(f"entitlement {name} holds {held} machines whose {cpus / SCALE:g} cores are "
                           f"{reserved / SCALE:g} reserved: moving {moves} task(s) within their MSBs frees "
                           f"{n} machine(s) for the free pool")
            else:
                out.append(f"entitlement {name} holds {held} machines ({reserved / SCALE:g} of "
                           f"{cpus / SCALE:g} cores reserved): none can be freed by moves within an MSB")
        if self.taken:
            out.append(f"swaps: {len(self.taken)} machine(s) exchanged with the free pool, "
                       f"{by_goal.get('swaps', 0)} task(s) moving with them; whole free racks "
                       f"{self.racks_free[0]} -> {self.racks_free[1]}")
        else:
            out.append("swaps: none: no exchange of a machine with a free one would even a spread or free a "
                       "whole rack")
        return out


def plan(region: Region | list[Group], churn: float = 0.25, time_limit: float = TIME_LIMIT,
         total_limit: float = TOTAL_LIMIT, cooling: frozenset[Key] | set[Key] = frozenset(),
         hot: float = HOT_MACHINE, margin: float = MSB_MARGIN, max_moves: int | None = None) -> Plan:
    """One round: repair, hotspots, then each group compacted, largest first: drained at once
    (compaction._drain), then improved by the solver for its share of what is left of total_limit
    (at most time_limit); once that is spent, the groups left keep their drain's answer. With
    `max_moves`: hotspots, the cheapest machines to free, repair, within that many moves."""
    started = time.monotonic()
    if not isinstance(region, Region):
        region = Region(list(region))
    board = Board(region, churn, cooling, hot, margin)
    before = scores(board)
    checked = Before(board, before)
    if max_moves is not None:
        board.max_moves = max_moves  # no task is movable once the round has made that many moves
        cooling = CoolingLeft(board)
        moves = cheapest(board, max_moves, lambda: cooling() * 5 // 4 + COOLING_SLACK)[0]
        moves += msb_hotspots(board) + machine_hotspots(board)
        moves += cheapest(board, max_moves - len(moves))[0]
        moves += repair(board)
        after = scores(board)
        return Plan((), tuple(moves), before, after, tuple(violations(checked, board, after)),
                    time.monotonic() - started, margin, hot, free_racks(region, board, before, after), {}, max_moves)
    moves = repair(board) + msb_hotspots(board) + machine_hotspots(board)
    deadline = time.monotonic() + total_limit
    results = []
    order = sorted(region.groups, key=lambda g: (-len(g.machines), g.entitlement, g.msb))
    for n, g in enumerate(order):
        share = (deadline - time.monotonic()) / (len(order) - n)
        r = solve_group(board, g, min(time_limit, share))
        results.append(r)
        moves += list(r.moves)
    moves += swaps(board)
    after = scores(board)
    return Plan(tuple(sorted(results, key=lambda r: (r.group.entitlement, r.group.dc, r.group.msb))), tuple(moves),
                before, after, tuple(violations(checked, board, after)), time.monotonic() - started, margin, hot,
                free_racks(region, board, before, after), dict(board.taken))


def free_racks(region: Region, board: Board, before: Scores, after: Scores) -> tuple[int, int]:
    """Racks whose every machine is in the free pool, before the round and after it (machines it
    empties go back to the pool; those swaps take leave it)."""
    racks = {r: list(v) for r, v in region.racks.items()}
    n0 = sum(1 for total, free in racks.values() if total and total == free)
    for mid in before.held - after.held:
        racks.setdefault(board.machines[mid].rack, [0, 0])[1] += 1
    for mid in board.taken:
        racks.setdefault(board.machines[mid].rack, [0, 0])[1] -= 1
    return n0, sum(1 for total, free in racks.values() if total and total == free)
