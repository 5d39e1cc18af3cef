"""What an update would do, asked of the job's TaskController without changing anything (issue #28):
the shard leader runs the pure reconciler on a copy of the job's tasks, offers what needs approval
to the controller in calls marked `dryRun: true` (in the session's own sequence), takes what it
acks as started, simulates their completion (each runs at the new version where it was; one whose
size changed is placed anew), and reports the next call's `completed` so, until every task is at
the new version or the controller acks nothing more. Nothing is written: etcd's revision is the
same after it. The last call reports the last round's completions with `dryRunEnd`: a controller
that does not know the flag saw ordinary calls, and is left with nothing in flight.

A job without a TaskController is simulated by its update policy (max_unavailable), as the
reconciler's built-in policy runs it."""

from __future__ import annotations

import secrets
import time
from dataclasses import replace
from typing import Awaitable, Callable, Mapping

from controlplane.scheduler.ops import Gate, MachineStatus, Op
from controlplane.scheduler.reconcile import reconcile
from controlplane.store.records import JobRec, TaskRec
from controlplane.taskcontrol.session import op_json, unhealthy

MAX_ROUNDS = 200
PLACED_ANEW = "(placed anew)"

# (request, completed, unhealthy, run id, end) -> acked op ids (TaskControlSession.dry_call)
Ask = Callable[[list[dict], list[dict], list[dict], str, bool], Awaitable[list[str]]]


def _completed(t: TaskRec) -> TaskRec:
    """A task whose operation finished: running at its version, where it was or on a new machine."""
    return t.moved(state="running", machine=t.machine or PLACED_ANEW, discovery=True, reason="")


def updated(job: JobRec) -> Callable[[Mapping[int, TaskRec]], bool]:
    """An update's end: every task of the job runs at its version."""
    return lambda sim: all(not job.live(i) or (t.spec_version == job.spec_version and t.state == "running")
                           for i, t in sim.items())


def moved_off(job: JobRec, machines: set[str]) -> Callable[[Mapping[int, TaskRec]], bool]:
    """A maintenance's end for the job: none of its tasks is left on those machines."""
    return lambda sim: not any(job.live(i) and t.machine in machines for i, t in sim.items())


async def dry_run(job: JobRec, tasks: Mapping[int, TaskRec], machines: Mapping[str, MachineStatus],
                  ask: Ask | None, done: Callable[[Mapping[int, TaskRec]], bool] | None = None,
                  what: str = "") -> dict:
    """The rounds an update of the job to `job` (its new record, not written) would take; or,
    with `done` and machines in maintenance, the moves away from them."""
    done = done or updated(job)
    sim = dict(tasks)
    rounds: list[dict] = []
    completed: list[dict] = []
    run_id = secrets.token_hex(6)
    calls, stuck = 0, ""
    # no agent's report: the simulated tasks are what the rounds made them (a report would put back
    # what runs now); a placed task's new machine is one healthy machine of no name
    machines = {**{mid: replace(v, reports=None) for mid, v in machines.items()},
                PLACED_ANEW: MachineStatus(PLACED_ANEW, True)}
    for n in range(1, MAX_ROUNDS + 1):
        if done(sim):
            break
        approved: frozenset[str] | None = None
        if ask is not None:
            first = reconcile(job, sim, machines, Gate(frozenset()), now=time.time())
            request = [op_json(job.handle, op) for op in first.proposed]
            acked = await ask(request, completed, unhealthy(first.after, job.live_set()), run_id, False) \
                if request else []
            calls += 1 if request else 0
            approved = frozenset(acked)
        plan = reconcile(job, sim, machines, Gate(approved), now=time.time())
        started = [op for op in plan.ops if op.id]
        changed = {new.index: new for _, new in plan.changes if new is not None}
        for i in plan.place:  # approved moves: placed elsewhere by the allocator, then running
            if i in sim and sim[i].machine is not None and i not in changed:
                changed[i] = sim[i].moved(machine=None, state="pending", discovery=False)
        if not changed:
            held = [str(op) for op in plan.held] + list(plan.waiting) or [f"{op} (not acked)" for op in plan.proposed]
            stuck = "; ".join(held[:5]) or "no operation proposed"
            break
        for i, new in changed.items():
            sim[i] = _completed(new) if new.spec_version == job.spec_version and new.state != "stopping" else new
        rounds.append({"round": n, "ops": [_op_view(op) for op in started],
                       "tasks": sorted(changed)})
        completed = [{**op_json(job.handle, op), "outcome": "done"} for op in started]
    if ask is not None and completed:
        await ask([], completed, unhealthy(sim, job.live_set()), run_id, True)
        calls += 1
    return {"job": job.handle, "spec_version": job.spec_version, "rounds": rounds, "calls": calls,
            "stuck": stuck, "summary": summary(job, rounds, calls, stuck, ask is not None, what)}


def _op_view(op: Op) -> dict:
    return {"id": op.id, "kind": op.kind, "index": op.index, "machine": op.machine, "reason": op.reason}


def summary(job: JobRec, rounds: list[dict], calls: int, stuck: str, controller: bool, what: str = "") -> list[str]:
    tasks = sum(len(r["tasks"]) for r in rounds)
    who = f"its TaskController, asked {calls} time(s) (dryRun: true)" if controller else \
        f"its update policy (max_unavailable {job.max_unavailable})"
    out = [f"dry run of {job.handle} {what or f'to v{job.spec_version}'}: {tasks} task(s) in {len(rounds)} round(s), "
           f"as {who}; nothing changed"]
    for r in rounds:
        out.append(f"round {r['round']}: " + ", ".join(f"{o['kind']} #{o['index']}" + (f" on {o['machine']}" if o["machine"]
                                                        else "") for o in r["ops"]))
    if stuck:
        out.append(f"then nothing more would proceed: {stuck}")
    return out
