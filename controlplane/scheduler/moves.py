"""The ReBalancer's moves as the scheduler carries them out (issue #27): make-before-break.

The ReBalancer only proposes: a round's moves are requests in the job's rebalance record
(`rebalance/<job>`: index -> {source, target, goal, why}), which the job's shard leader, its one
writer, takes in its pass, here, pure as the rest of the reconciler:

- a request whose task is no longer running where the plan saw it, at the job's version, or whose
  target is not healthy, ready and out of maintenance, is dropped, with why (so is one the
  scheduler found no room for on the target, and one the job's TaskController declined: see
  service.py);
- otherwise it is a `move` operation with cause `rebalance`, which the job's TaskController acks
  (or a job without one allows) and the destructive rate limits pass, like any move; once it
  may proceed, the task gets a copy starting on the target (TaskRec.moving): the task holds
  resources on both machines, and the target's agent runs the copy while the task still runs
  (and is in discovery) where it was;
- when the target's agent reports the copy running at the task's version, the task is switched
  over in one commit: its machine is the target, its discovery record points there, and the
  source's agent, whose desired state no longer has it, stops the old copy. Never down;
- a copy that fails, does not run within MOVE_DEADLINE, or whose machine fails or goes into
  maintenance, is given up: the copy is stopped, the task stays where it was.
"""

from __future__ import annotations

from typing import Mapping

from controlplane.scheduler.ops import Gate, JobPlan, MachineStatus, Op
from controlplane.store.records import JobRec, Moving, TaskRec

MOVE_DEADLINE = 300.0  # seconds a moving copy has to run before the move is given up


def move_id(index: int, target: str) -> str:
    """The TaskControl operation id of a rebalance move: what the job's controller acks."""
    return f"move/{index}/rebalance/{target}"


def move_op(index: int, source: str | None, req: dict) -> Op:
    """A requested move's operation: the ReBalancer's (cause `rebalance`), or a profile rollout's
    (goal `reprofile`: the job asked its tasks to move off a machine about to switch)."""
    cause = "reprofile" if req.get("goal") == "reprofile" else "rebalance"
    return Op("move", index, f"{cause} ({req.get('goal', '')}): {req.get('why', '')}",
              move_id(index, req["target"]), source, cause)


def rebalance(job: JobRec, current: dict[int, TaskRec], machines: Mapping[str, MachineStatus],
              requests: Mapping[int, dict], change, plan: JobPlan, gate: Gate, now: float) -> None:
    for t in sorted((t for t in current.values() if t.moving is not None), key=lambda t: t.index):
        _step(t, machines, change, plan, now)
    for i, req in sorted(requests.items()):
        t = current.get(i)
        target = req.get("target", "")
        why = _unfit(job, t, req, machines.get(target))
        if why:
            plan.dropped[i] = why
            continue
        op = move_op(i, t.machine, req)
        if gate.allow(op, plan):
            moving = Moving(target, str(req.get("goal", "")), str(req.get("why", "")), now)
            change(t, t.moved(moving=moving, reason=f"moving to {target} (make-before-break)"), op)
            plan.begun.append(i)


def _unfit(job: JobRec, t: TaskRec | None, req: dict, target: MachineStatus | None) -> str:
    """Why a requested move cannot start ("" when it can)."""
    if job.state != "active" or t is None or not job.live(t.index):
        return "the task is gone"
    if t.moving is not None:
        return f"it is moving to {t.moving.machine} already"
    if t.state != "running" or t.machine != req.get("source") or t.spec_version != job.spec_version:
        return f"the task is no longer running on {req.get('source')} at v{job.spec_version} as planned"
    if req.get("target") == t.machine:
        return "it runs there already"
    if target is None or not target.healthy:
        return f"{req.get('target')} is not healthy"
    if target.maintenance is not None:
        return f"{req.get('target')} is in maintenance"
    if target.reprofile is not None and target.reprofile.stops:
        return f"{req.get('target')} is {target.reprofile.phase} in a profile rollout"
    if not target.profile_ready and not req.get("take"):  # (a free machine taken gets the profile then)
        return f"{req.get('target')} does not have its entitlement's profile ready"
    return ""


def _step(t: TaskRec, machines: Mapping[str, MachineStatus], change, plan: JobPlan, now: float) -> None:
    mv = t.moving
    assert mv is not None
    m = machines.get(mv.machine)
    why = ""
    if m is None or not m.healthy:
        why = f"{mv.machine} is {'gone' if m is None else 'unhealthy'}"
    elif m.maintenance is not None:
        why = f"{mv.machine} went into maintenance"
    elif not m.profile_ready:
        if now - mv.since > MOVE_DEADLINE:
            why = f"{mv.machine} did not get profile {m.desired_profile} within {MOVE_DEADLINE:g} s"
        else:
            plan.waiting.append(f"#{t.index}: moving to {mv.machine}: waiting for profile {m.desired_profile} there")
            return
    else:
        r = m.reports.get((t.job, t.index)) if m.reports is not None else None
        if r is not None and r.get("spec_version") == t.spec_version:
            if r.get("state") == "running":
                change(t, t.moved(machine=mv.machine, moving=None, reason=f"moved from {t.machine}: {mv.why}"),
                       Op("moved", t.index, f"from {t.machine} to {mv.machine} ({mv.goal})", machine=t.machine,
                          cause="rebalance"))
                plan.ended.append((t.index, t.machine, mv, "done"))
                return
            if r.get("state") in ("exited", "failed") or r.get("error"):
                why = f"its copy on {mv.machine} failed: {r.get('error') or 'exit code ' + str(r.get('exit_code'))}"
        if not why and now - mv.since > MOVE_DEADLINE:
            why = f"its copy on {mv.machine} did not run within {MOVE_DEADLINE:g} s"
    if not why:
        plan.waiting.append(f"#{t.index}: moving to {mv.machine} (make-before-break): its copy is starting")
        return
    change(t, t.moved(moving=None, reason=f"move to {mv.machine} given up: {why}"),
           Op("move-given-up", t.index, why, machine=t.machine, cause="rebalance"))
    plan.ended.append((t.index, t.machine, mv, f"given up: {why}"))
