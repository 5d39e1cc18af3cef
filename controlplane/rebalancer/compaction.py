"""Compaction of one (entitlement, MSB) group with CP-SAT: which machines to keep and where each
running task goes, so that the fewest machines stay held and, among the ways to hold that few, the
fewest tasks move (lexicographic: one machine freed is worth more than every move together).

A bounded sub-problem: the machines that may be freed are the emptiest (by what they reserve), at
most twice as many as the group could free by its totals and MAX_CANDIDATES; the tasks on them
are the ones that may move, onto any machine of the group with room; what else the group holds
stays. A group whose totals need as many machines as it holds is not solved at all.

x[t, m] = 1: task t runs on machine m; y[m] = 1: candidate machine m stays held.
- each task on one machine; a machine's tasks (with what stays on it) within its cpus and
  memory, and on a machine not kept, none; below the hot share of its cores by measured cpu
  (board.py: a move never makes a machine hot);
- a machine holding something that may not move (a task not running, a tombstone, a task that
  moved this round or cools down from a move) is no candidate: it is kept;
- a task of a job that spreads over racks moves within its rack only;
- moves per job within what is left of its churn budget.
Before the solver, a drain (_drain): the candidates, emptiest first, each emptied whole if its
tasks fit elsewhere (best fit). Its answer is the solver's hint (a feasible solution from the first
moment, starting from where the tasks are), and the group's answer when it is provably optimal or
no time is left; the solver stops at its time limit with the best it found. Moves stay within the group's MSB, so a job's
spread over dcs and MSBs is the same after them; within an MSB the allocator stacks an
entitlement's tasks too, so what compaction makes is what the allocator would have made."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from controlplane.rebalancer.board import Board, Key, Planned
from controlplane.rebalancer.view import Group, Region

TIME_LIMIT = 2.0  # seconds a group's solve may take
MAX_VARS = 20_000  # x variables a group's model may hold; beyond, a task's destinations are narrowed
MAX_CANDIDATES = 200  # machines of a group that one solve may free
MIN_SOLVE = 0.02  # seconds: with less, a group keeps the drain's answer


@dataclass(frozen=True)
class Result:
    group: Group
    kept: tuple[str, ...]
    freed: tuple[str, ...]
    moves: tuple[Planned, ...]
    status: str  # optimal, feasible (the time limit), or why nothing was solved
    seconds: float


def solve(g: Group, churn: float = 0.25, time_limit: float = TIME_LIMIT, workers: int = 1) -> Result:
    """One group on a board of its own (tests, and a plan of one group)."""
    return solve_group(Board(Region([g]), churn), g, time_limit, workers)


def solve_group(board: Board, g: Group, time_limit: float = TIME_LIMIT, workers: int = 1) -> Result:
    gk = (g.entitlement, g.dc, g.msb)
    ids = board.in_group[gk]
    started = time.monotonic()
    if len(ids) < 2:
        return Result(g, tuple(ids), (), (), "nothing to compact", 0.0)
    ids = sorted(ids)
    holding = [mid for mid in ids if board.holds(mid)]
    spare = _spare(board, holding)
    cand = _candidates(board, holding, spare)
    if not cand:
        return Result(g, tuple(holding), (), (), "nothing to compact", time.monotonic() - started)
    movable = [k for mid in cand for k in sorted(board.on[mid])]
    allowed = _destinations(board, movable, cand, ids)
    hint, drained = _drain(board, cand, allowed)
    # The drain is optimal when it frees as many machines as the group's totals allow with no
    # more moves than the tasks of the machines holding fewest: nothing to ask the solver then.
    fewest = sum(sorted(len(board.on[mid]) for mid in cand)[:len(drained)])
    if len(drained) == spare and sum(1 for k in movable if hint[k] != board.where[k]) == fewest:
        return _apply(board, g, holding, drained, hint, movable, "optimal (drain)", started)
    if time_limit < MIN_SOLVE:
        return _apply(board, g, holding, drained, hint, movable, "drain (no time left for the solver)", started)
    model = cp_model.CpModel()
    y = {mid: model.new_bool_var(f"y[{mid}]") for mid in cand}
    x: dict[tuple[Key, str], cp_model.IntVar] = {}
    for key in movable:
        for mid in allowed[key]:
            x[key, mid] = model.new_bool_var(f"x[{key[0]}#{key[1]},{mid}]")
        model.add_exactly_one(x[key, mid] for mid in allowed[key])
    on: dict[str, list[Key]] = {}
    for (key, mid) in x:
        on.setdefault(mid, []).append(key)
    moving = set(movable)
    for mid, keys in on.items():
        m = board.machines[mid]
        stays = [k for k in board.on[mid] if k not in moving]
        keep = y.get(mid, 1)
        fixed_cpus = m.cpus - board.free_cpus[mid] - sum(board.tasks[k].cpus for k in board.on[mid] if k in moving)
        fixed_mem = m.memory_mb - board.free_mem[mid] - sum(board.tasks[k].memory_mb for k in board.on[mid]
                                                            if k in moving)
        fixed_used = sum(board.tasks[k].used for k in stays)
        model.add(sum(board.tasks[k].cpus * x[k, mid] for k in keys) + fixed_cpus * keep <= m.cpus * keep)
        model.add(sum(board.tasks[k].memory_mb * x[k, mid] for k in keys) + fixed_mem * keep <= m.memory_mb * keep)
        model.add(sum(board.tasks[k].used * x[k, mid] for k in keys) + fixed_used * keep
                  <= int(board.hot_limit(mid)) * keep)
    by_job: dict[str, list[Key]] = {}
    for key in movable:
        by_job.setdefault(key[0], []).append(key)
    moved = []
    for job, keys in by_job.items():
        stays = [x[k, board.where[k]] for k in keys]
        model.add(len(keys) - sum(stays) <= board.budget[job])
        moved += [1 - v for v in stays]
    big = len(movable) + 1
    model.minimize(big * sum(y.values()) + sum(moved))
    for (key, mid), v in x.items():
        model.add_hint(v, 1 if hint[key] == mid else 0)
    for mid in cand:
        model.add_hint(y[mid], 0 if mid in drained else 1)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.0, time_limit - (time.monotonic() - started))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 7  # the same answer for the same region
    code = solver.solve(model)
    status = solver.status_name(code).lower()
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # the drain's answer stands (it is what the hint was)
        return _apply(board, g, holding, drained, hint, movable, f"{status} (drain)", started)
    freed = [mid for mid in cand if not solver.value(y[mid])]
    targets = {key: next(mid for mid in allowed[key] if solver.value(x[key, mid])) for key in movable}
    return _apply(board, g, holding, freed, targets, movable, status, started)


def _apply(board: Board, g: Group, holding: list[str], freed: list[str], targets: dict[Key, str],
           movable: list[Key], status: str, started: float) -> Result:
    moves = []
    gone = set(freed)
    for key in movable:
        target, source = targets[key], board.where[key]
        if target != source:
            why = (f"compaction: frees {source}" if source in gone else
                   f"compaction: makes room on {target} for tasks of a machine being freed")
            moves.append(board.move(key, target, "compaction", why))
    kept = tuple(mid for mid in holding if mid not in gone)
    return Result(g, kept, tuple(sorted(gone)), tuple(moves), status, time.monotonic() - started)


def _drain(board: Board, cand: list[str], allowed: dict[Key, list[str]]) -> tuple[dict[Key, str], list[str]]:
    """A first answer (the solver's hint): the candidates, emptiest first, each drained whole if
    its tasks, largest first, fit elsewhere (best fit: the allocator's pick), or left as it is."""
    free_c, free_m, used = dict(board.free_cpus), dict(board.free_mem), dict(board.used)
    budget = dict(board.budget)
    target = {k: board.where[k] for mid in cand for k in board.on[mid]}
    on = {mid: set(board.on[mid]) for mid in cand}
    drained: list[str] = []
    gone: set[str] = set()
    for c in cand:
        trial: list[tuple[Key, str]] = []
        spent: dict[str, int] = {}
        ok = True
        for key in sorted(on[c], key=lambda k: (-board.tasks[k].cpus, k)):
            t = board.tasks[key]
            first_move = target[key] == board.where[key]
            if first_move and budget[key[0]] - spent.get(key[0], 0) <= 0:
                ok = False
                break
            fits = [mid for mid in allowed[key] if mid != c and mid not in gone and free_c[mid] >= t.cpus
                    and free_m[mid] >= t.memory_mb and used[mid] + t.used <= board.hot_limit(mid)]
            if not fits:
                ok = False
                break
            mid = min(fits, key=lambda m: (free_c[m], free_m[m], m))
            trial.append((key, mid))
            free_c[mid] -= t.cpus
            free_m[mid] -= t.memory_mb
            used[mid] += t.used
            if first_move:
                spent[key[0]] = spent.get(key[0], 0) + 1
        if ok:
            for key, mid in trial:
                target[key] = mid
                on.setdefault(mid, set()).add(key)
            for job, n in spent.items():
                budget[job] -= n
            on[c] = set()
            gone.add(c)
            drained.append(c)
        else:
            for key, mid in trial:
                t = board.tasks[key]
                free_c[mid] += t.cpus
                free_m[mid] += t.memory_mb
                used[mid] -= t.used
    return target, drained


def _spare(board: Board, holding: list[str]) -> int:
    """How many machines the group's totals (cpus, memory) say could be freed at most."""
    cpus = sum(board.machines[mid].cpus - board.free_cpus[mid] for mid in holding)
    mem = sum(board.machines[mid].memory_mb - board.free_mem[mid] for mid in holding)
    need_c = _needed(sorted((board.machines[mid].cpus for mid in holding), reverse=True), cpus)
    need_m = _needed(sorted((board.machines[mid].memory_mb for mid in holding), reverse=True), mem)
    return len(holding) - max(need_c, need_m)


def _candidates(board: Board, holding: list[str], spare: int) -> list[str]:
    """The machines a solve may free: none if the group's reservations need every machine it
    holds (spare: _spare()); else the emptiest machines whose every task may move, at most twice
    as many as the totals say could be freed (and MAX_CANDIDATES)."""
    if spare <= 0:
        return []
    free = [mid for mid in holding if board.clear(mid) and all(board.movable(k) for k in board.on[mid])]
    free.sort(key=lambda mid: (board.machines[mid].cpus - board.free_cpus[mid], mid))
    return free[:min(MAX_CANDIDATES, 2 * spare + 2)]


def _needed(capacities: list[int], total: int) -> int:
    n, acc = 0, 0
    for c in capacities:
        if acc >= total:
            break
        acc += c
        n += 1
    return n


def _destinations(board: Board, movable: list[Key], cand: list[str], ids: list[str]) -> dict[Key, list[str]]:
    """Each movable task's possible machines: its own, the candidates and the group's other
    machines with room for it (all of its MSB, so of its dc: a job's dc requirement holds on
    each), or of its rack; in a large group, the fullest of them (the ones compaction keeps)."""
    in_cand = set(cand)
    by_fill = sorted(ids, key=lambda mid: (board.free_cpus[mid], mid))
    per_task = max(2, MAX_VARS // max(1, len(movable)))
    out = {}
    for key in movable:
        t, here = board.tasks[key], board.where[key]
        rack = board.machines[here].rack
        ok = [mid for mid in by_fill
              if (mid in in_cand or board.free_cpus[mid] >= t.cpus and board.free_mem[mid] >= t.memory_mb)
              and (not t.keep_rack or board.machines[mid].rack == rack)]
        if len(ok) > per_task:
            ok = ok[:per_task - 1]
        if here not in ok:
            ok.append(here)
        out[key] = ok
    return out
