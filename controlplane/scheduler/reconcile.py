"""The scheduler's reconciler: a pure function from one job's desired state (count, spec version,
state) and its tasks, as the machines see them, to named operations and the new task records.

Level-triggered like the agent's: the service runs it on every change and on a steady interval,
commits what it returns in one guarded transaction, and runs it again. Placement itself is the
allocator's; the reconciler only says which tasks need a machine.

Lifecycle of a task (DESIGN.md):
    pending -> allocated -> starting -> running          (placed; profile applied; agent runs it)
    running -> starting                                   (restart for update: new spec on the same machine)
    any -> lost                                           (its machine stopped answering) -> placed elsewhere
    any -> suspended -> starting                          (its machine's maintenance began; it ended)
    any -> suspended -> pending                           (its opportunistic machine reclaimed: acked, or the deadline)
    running -> suspended -> starting                      (its machine's profile switch: reprofile)
    running <-> failed                                    (the container exited; the agent restarts it)
    any -> stopping -> stopped / deleted                  (job stopped / shrunk: gone from the agent)
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Mapping

from controlplane.scheduler.moves import rebalance
from controlplane.scheduler.ops import Gate, JobPlan, MachineStatus, Maintenance, Op, Reprofile
from controlplane.store.records import JobRec, TaskRec

# the reconciler's values live in ops.py (moves.py shares them); its callers import them from here
__all__ = ["Gate", "JobPlan", "MachineStatus", "Maintenance", "Op", "Reprofile", "reconcile"]


def _unavailable(t: TaskRec | None) -> bool:
    return t is None or t.state != "running"


def reconcile(job: JobRec, tasks: Mapping[int, TaskRec], machines: Mapping[str, MachineStatus],
              gate: Gate | None = None, requests: Mapping[int, dict] | None = None,
              now: float | None = None) -> JobPlan:
    plan = JobPlan()
    gate = gate or Gate()
    current: dict[int, TaskRec] = dict(tasks)
    movable: set[int] = set()

    def change(t: TaskRec, new: TaskRec | None, op: Op | None) -> None:
        plan.changes.append((t, new))
        if new is None:
            current.pop(t.index, None)
        else:
            current[t.index] = new
        if op is not None:
            plan.ops.append(op)

    stopping_job = job.state != "active"
    for t in sorted(tasks.values(), key=lambda t: t.index):
        m = machines.get(t.machine) if t.machine else None
        live = job.live(t.index)
        if stopping_job or not live or t.state == "stopping":
            _stop_step(job, t, m, change, plan, gate, final="stopped" if stopping_job and live else None)
        else:
            _live_step(t, m, change, plan)

    plan.seen = dict(current)
    if not stopping_job:
        _rolling_update(job, current, machines, change, plan, gate)
        if any(m.reprofile is not None and m.reprofile.stops for m in machines.values()):
            _reprofile(job, current, machines, change, plan, gate, requests or {})
        if requests or any(t.moving is not None for t in current.values()):
            rebalance(job, current, machines, requests or {}, change, plan, gate,
                      time.time() if now is None else now)
        if any(m.maintenance is not None and m.maintenance.kind == "reclaim" for m in machines.values()):
            _reclaims(job, current, machines, change, plan, gate)
        if not plan.changes:
            # Moves (away from a failed machine, or one in maintenance) happen in a pass of their
            # own: their placement is the next commit, and only then are their rate-limit tokens taken.
            movable = _moves(job, current, machines, plan, gate)
        plan.place = tuple(i for i in job.indices() if i in movable or _needs_machine(current.get(i)))
    elif all(t.state == "stopped" for t in current.values()) and job.state != "stopped":
        plan.job = replace(job, state="stopped")
    plan.after = current
    return plan


def _needs_machine(t: TaskRec | None) -> bool:
    """A task without a machine that should have one. (Tasks on a failed machine or one in
    maintenance are placed only when their move is approved: see _moves.)"""
    return t is None or (t.machine is None and t.state in ("pending", "stopped"))


def _moves(job: JobRec, current: dict[int, TaskRec], machines: Mapping[str, MachineStatus], plan: JobPlan,
           gate: Gate) -> set[int]:
    """The tasks to place elsewhere now: those on a failed machine, and those on a machine in
    maintenance. Each is a move operation the job's TaskController acks; a job without one moves
    failed tasks at once, and maintenance tasks as its policy says, before the deadline only while
    fewer than max_unavailable tasks are down."""
    movable: set[int] = set()
    down = sum(1 for i in job.indices() if _unavailable(current.get(i)))
    for i, t in sorted(current.items()):
        m = machines.get(t.machine) if t.machine else None
        if not job.live(i) or t.machine is None:
            continue
        mt = m.maintenance if m is not None else None
        if t.state == "lost" and (m is None or not m.healthy):
            op = Op("move", i, f"machine failure: {t.reason}", f"move/{i}/{t.machine}", t.machine, "machine failure")
        elif mt is not None and t.state in ("allocated", "starting", "running", "failed", "suspended"):
            when = "now" if mt.active else f"deadline {_clock(mt.deadline)}"
            op = Op("move", i, f"maintenance {mt.id} ({when})", f"move/{i}/{t.machine}", t.machine, "maintenance")
            if gate.approved is None:  # the built-in policy
                if mt.policy == "stop":
                    if not mt.active:
                        plan.waiting.append(f"#{i}: stays on {t.machine} until maintenance {mt.id} stops it at "
                                            f"{_clock(mt.deadline)} (policy stop)")
                    continue
                if not _unavailable(t) and down >= job.max_unavailable:
                    plan.held.append(replace(op, reason=f"{op.reason}: {down} of max {job.max_unavailable} unavailable"))
                    continue
        else:
            continue
        if gate.allow(op, plan):
            movable.add(i)
            plan.ops.append(op)
            if not _unavailable(t):
                down += 1
    return movable


def _reclaims(job: JobRec, current: dict[int, TaskRec], machines: Mapping[str, MachineStatus], change,
              plan: JobPlan, gate: Gate) -> None:
    """Tasks on an opportunistic machine being reclaimed, before its deadline: each a `reclaim`
    operation for the job's TaskController; one it acks stops now (the machine goes sooner). A job
    without a TaskController keeps running until the deadline (_live_step stops it then)."""
    for i, t in sorted(current.items()):
        m = machines.get(t.machine) if t.machine else None
        mt = m.maintenance if m is not None else None
        if mt is None or mt.kind != "reclaim" or mt.active or not job.live(i) or not m.healthy \
                or t.state not in ("allocated", "starting", "running", "failed"):
            continue
        op = Op("reclaim", i, f"reclaim {mt.id} for {mt.heir or 'the reserve'} (deadline {_clock(mt.deadline)})",
                f"reclaim/{i}/{t.machine}", t.machine, "reclaim")
        if gate.approved is None:
            plan.waiting.append(f"#{i}: runs on {t.machine} until reclaim {mt.id} stops it at {_clock(mt.deadline)}")
        elif gate.allow(op, plan):
            change(t, t.moved(state="suspended", discovery=False, reason=f"reclaim {mt.id}: acked"), op)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _stop_step(job: JobRec, t: TaskRec, m: MachineStatus | None, change, plan: JobPlan, gate: Gate,
               final: str | None) -> None:
    """A task that should not run: disable discovery and take it off its machine; once the agent
    no longer reports it (or its machine is gone), it is stopped (kept as a record when the job
    stopped, deleted when the job shrank)."""
    gone = m is None or not m.healthy or (m.reports is not None and (t.job, t.index) not in m.reports)
    reason = "job stopped" if job.state != "active" else f"resize to {job.count}"
    if t.state == "stopped":
        if not job.live(t.index):
            change(t, None, Op("delete", t.index, reason))
        return
    if t.machine is None or (t.state == "stopping" and gone) or (m is None or not m.healthy):
        if final:
            change(t, t.moved(state=final, machine=None, discovery=False, reason=reason), Op("stopped", t.index, reason))
        else:
            change(t, None, Op("delete", t.index, reason))
    elif t.state != "stopping":
        op = Op("stop", t.index, reason, f"stop/{t.index}", t.machine, "resize" if job.state == "active" else "stop")
        # a shrink is the job's TaskController's to approve; a whole-job stop is the owner's order
        if gate.allow(op, plan, controller=job.state == "active"):
            change(t, t.moved(state="stopping", discovery=False, reason=reason), op)


def _live_step(t: TaskRec, m: MachineStatus | None, change, plan: JobPlan) -> None:
    key = (t.job, t.index)
    if t.machine is None:
        if t.state == "pending":
            plan.waiting.append(f"#{t.index}: pending{': ' + t.reason if t.reason else ''}")
        return
    mt = m.maintenance if m is not None else None
    if mt is not None and mt.kind == "reclaim" and m.healthy:
        if t.state == "suspended":
            if m.reports is not None and key not in m.reports:  # stopped there: it leaves the machine
                why = f"reclaim {mt.id}: machine taken back for {mt.heir or 'the reserve'}"
                change(t, t.moved(state="pending", machine=None, discovery=False, reason=why), Op("reclaimed", t.index, why))
            return
        if mt.active:  # the notice is over: what is still here stops
            why = f"reclaim {mt.id}: notice over"
            change(t, t.moved(state="suspended", discovery=False, reason=why), Op("suspend", t.index, why))
            return
    elif mt is not None and mt.active:
        # the maintenance proceeds at its deadline: what is still here stops, whoever wanted it kept
        if t.state != "suspended":
            why = f"maintenance {mt.id} until {_clock(mt.until)}"
            change(t, t.moved(state="suspended", discovery=False, reason=why), Op("suspend", t.index, why))
        return
    if m is None or not m.healthy:
        if t.state != "lost":
            why = f"machine {t.machine} {'is gone' if m is None else 'unhealthy: ' + m.health_reason}"
            change(t, t.moved(state="lost", discovery=False, reason=why), Op("lost", t.index, why))
        return
    if t.state == "suspended" and m.reprofile is not None and m.reprofile.stops:
        return  # stopped until its machine's new profile is applied
    if t.state in ("lost", "suspended"):
        why = "machine back" if t.state == "lost" else \
            "profile switched" if t.reason.startswith("profile rollout") else "maintenance over"
        # the machine may have lost its profile meanwhile (reimaged): the sidekick gate again
        state = "starting" if m.profile_ready else "allocated"
        change(t, t.moved(state=state, reason=f"{why} on {m.id}"), Op("start" if state == "starting" else state, t.index, why))
        return
    if t.state == "allocated":
        if m.profile_ready:
            change(t, t.moved(state="starting", reason=""), Op("start", t.index, f"on {m.id}"))
        else:
            why = f": the agent refused it: {m.error}" if m.error else ""
            plan.waiting.append(f"#{t.index}: waiting for profile {m.desired_profile} on {m.id}{why}")
        return
    if m.reports is None:
        return
    r = m.reports.get(key)
    new = _from_report(t, r)
    if new != t:
        change(t, new, Op(new.state, t.index, new.reason or f"on {m.id}") if new.state != t.state else None)


def _from_report(t: TaskRec, r: dict | None) -> TaskRec:
    """The task as its agent reports it (states starting, running, failed)."""
    if r is None:
        return t.moved(state="starting", discovery=False, reason=t.reason if t.state == "starting" else "no container yet")
    if r.get("spec_version") != t.spec_version:
        return t.moved(state="starting", discovery=False, reason=f"replacing spec v{r.get('spec_version')}")
    if r.get("state") == "running":
        return t.moved(state="running", discovery=True, reason="")
    if r.get("state") in ("exited", "failed") or r.get("error"):
        why = r.get("error") or f"exited with code {r.get('exit_code')}; restarts {r.get('restarts', 0)}"
        return t.moved(state="failed", discovery=False, reason=why)
    return t.moved(state="starting", discovery=False, reason="")


def _rolling_update(job: JobRec, current: dict[int, TaskRec], machines: Mapping[str, MachineStatus],
                    change, plan: JobPlan, gate: Gate) -> None:
    """Bring tasks to the job's spec version. A task that is down anyway is updated at once; a
    running one is restarted only while fewer than max_unavailable tasks are down. A task whose
    size changed moves (it is placed afresh), the rest restart in place."""
    outdated = sorted((t for i, t in current.items() if job.live(i) and t.spec_version < job.spec_version
                       and t.state != "stopping"), key=lambda t: t.index)
    down = sum(1 for i in job.indices() if _unavailable(current.get(i)))
    for t in outdated:
        was_down = _unavailable(t)
        new = _updated(job, t)
        kind = "move" if new.machine is None and t.machine is not None else "restart"
        op = Op(kind, t.index, f"update v{t.spec_version} -> v{job.spec_version}",
                f"{kind}/{t.index}/v{job.spec_version}", t.machine, "update", job.spec_version)
        if not was_down and not _may_take_down(op, job, down, plan, gate):
            continue
        change(t, new, op)
        if not was_down:
            down += 1


def _may_take_down(op: Op, job: JobRec, down: int, plan: JobPlan, gate: Gate) -> bool:
    """Whether an operation may take a running task down now: the job's TaskController acked it,
    or, for a job without one, fewer than max_unavailable tasks are down (else it is held)."""
    if gate.approved is None and down >= job.max_unavailable:
        plan.held.append(replace(op, reason=f"{op.reason}: {down} of max {job.max_unavailable} unavailable"))
        return False
    return gate.allow(op, plan)


def _reprofile(job: JobRec, current: dict[int, TaskRec], machines: Mapping[str, MachineStatus], change,
               plan: JobPlan, gate: Gate, requests: Mapping[int, dict]) -> None:
    """Stop the tasks on machines whose profile a rollout is about to switch: each a `reprofile`
    operation the job's TaskController acks; a job without one stops them while fewer than
    max_unavailable tasks are down. A task down anyway is stopped at once. They stay on their
    machine (and hold its resources) and start there again once the new profile is applied. A task
    moving away (a job with `update.reprofile: move`: a move requested of it, moves.py) is left to
    its move."""
    down = sum(1 for i in job.indices() if _unavailable(current.get(i)))
    for i, t in sorted(current.items()):
        m = machines.get(t.machine) if t.machine else None
        rp = m.reprofile if m is not None else None
        if rp is None or not rp.stops or not job.live(i) or t.state not in ("starting", "running", "failed") \
                or t.moving is not None or i in requests:
            continue
        why = f"profile rollout {rp.rollout} on {t.machine}: {rp.what}"
        op = Op("reprofile", i, why, f"reprofile/{i}/{t.machine}/{rp.rollout}", t.machine, "reprofile")
        if not _unavailable(t):
            if not _may_take_down(op, job, down, plan, gate):
                continue
            down += 1
        change(t, t.moved(state="suspended", discovery=False, reason=why), op)


def _updated(job: JobRec, t: TaskRec) -> TaskRec:
    new_res = (float(job.task["cpus"]), int(job.task["memory_mb"]))
    base = dict(spec=job.task, spec_version=job.spec_version, discovery=False,
                reason=f"update to v{job.spec_version}")
    if t.machine is None or t.state in ("pending", "stopped"):
        return t.moved(**base)
    if new_res != t.resources:
        return t.moved(**base, machine=None, state="pending")
    state = t.state if t.state in ("allocated", "lost", "suspended") else "starting"
    return t.moved(**base, state=state)
