"""Compaction of one (entitlement, MSB) group with CP-SAT: which machines to keep and where each
running task goes, so that the fewest machines stay held and, among the ways to hold that few, the
fewest tasks move (lexicographic: one machine freed is worth more than every move together).

x[t, m] = 1: task t runs on machine m; y[m] = 1: machine m stays held.
- each task on one machine; a machine's tasks (with what is fixed on it) within its cpus and
  memory, and on a machine not kept, none;
- a machine holding something that may not move (a task not running, a tombstone) is kept;
- a task of a job that spreads over racks moves within its rack only;
- moves per job within its churn budget.
The solver starts from the current assignment (a hint: a feasible solution from the first moment)
and stops at its time limit with the best it found. Moves stay within the group's MSB, so a job's
spread over dcs and MSBs is the same after them; within an MSB the allocator stacks an
entitlement's tasks too, so what compaction makes is what the allocator would have made."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from controlplane.rebalancer.view import Group

TIME_LIMIT = 2.0  # seconds a group's solve may take
MAX_VARS = 20_000  # x variables a group's model may hold; beyond, a task's destinations are narrowed


@dataclass(frozen=True)
class Move:
    job: str
    index: int
    source: str
    target: str


@dataclass(frozen=True)
class Result:
    group: Group
    kept: tuple[str, ...]
    freed: tuple[str, ...]
    moves: tuple[Move, ...]
    status: str  # optimal, feasible (the time limit), or why nothing was solved
    seconds: float


def churn_budget(n: int, fraction: float) -> int:
    return max(1, math.ceil(n * fraction))


def solve(g: Group, churn: float = 0.25, time_limit: float = TIME_LIMIT, workers: int = 1) -> Result:
    machines = {m.id: m for m in g.machines}
    if len(machines) < 2 or not g.tasks:
        return Result(g, tuple(sorted(machines)), (), (), "nothing to compact", 0.0)
    ids = sorted(machines)
    model = cp_model.CpModel()
    y = {mid: model.new_bool_var(f"y[{mid}]") for mid in ids}
    allowed = _destinations(g, ids)
    x: dict[tuple[int, str], cp_model.IntVar] = {}
    for ti, t in enumerate(g.tasks):
        for mid in allowed[ti]:
            x[ti, mid] = model.new_bool_var(f"x[{ti},{mid}]")
        model.add_exactly_one(x[ti, mid] for mid in allowed[ti])
    on: dict[str, list[int]] = {mid: [] for mid in ids}
    for (ti, mid) in x:
        on[mid].append(ti)
    for mid in ids:
        m = machines[mid]
        if m.pinned:
            model.add(y[mid] == 1)
        model.add(sum(g.tasks[ti].cpus * x[ti, mid] for ti in on[mid]) + m.fixed_cpus * y[mid] <= m.cpus * y[mid])
        model.add(sum(g.tasks[ti].memory_mb * x[ti, mid] for ti in on[mid]) + m.fixed_memory_mb * y[mid]
                  <= m.memory_mb * y[mid])
    by_job: dict[str, list[int]] = {}
    for ti, t in enumerate(g.tasks):
        by_job.setdefault(t.job, []).append(ti)
    moved = []
    for job, tis in by_job.items():
        stays = [x[ti, g.tasks[ti].machine] for ti in tis]
        model.add(len(tis) - sum(stays) <= churn_budget(len(tis), churn))
        moved += [1 - v for v in stays]
    big = len(g.tasks) + 1
    model.minimize(big * sum(y.values()) + sum(moved))
    for (ti, mid), v in x.items():
        model.add_hint(v, 1 if g.tasks[ti].machine == mid else 0)
    for mid in ids:
        model.add_hint(y[mid], 1)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 7  # the same answer for the same region
    code = solver.solve(model)
    status = solver.status_name(code).lower()
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Result(g, tuple(ids), (), (), status, solver.wall_time)
    kept = tuple(mid for mid in ids if solver.value(y[mid]))
    moves = []
    for ti, t in enumerate(g.tasks):
        target = next(mid for mid in allowed[ti] if solver.value(x[ti, mid]))
        if target != t.machine:
            moves.append(Move(t.job, t.index, t.machine, target))
    freed = tuple(mid for mid in ids if mid not in kept)
    return Result(g, kept, freed, tuple(moves), status, solver.wall_time)


def _destinations(g: Group, ids: list[str]) -> list[list[str]]:
    """Each task's possible machines: every machine of the group (all of its MSB, so of its dc:
    a job's dc requirement holds on each), or of its rack; in a large group, its own and the
    fullest others (the ones compaction would keep)."""
    fill = {m.id: m.fixed_cpus for m in g.machines}
    rack = {m.id: m.rack for m in g.machines}
    for t in g.tasks:
        fill[t.machine] += t.cpus
    by_fill = sorted(ids, key=lambda mid: (-fill[mid], mid))
    per_task = max(2, MAX_VARS // max(1, len(g.tasks)))
    out = []
    for t in g.tasks:
        ok = [mid for mid in by_fill if rack[mid] == rack[t.machine]] if t.keep_rack else by_fill
        if len(ok) > per_task:
            ok = ok[:per_task - 1]
            if t.machine not in ok:
                ok = [*ok, t.machine]
        out.append(ok)
    return out
