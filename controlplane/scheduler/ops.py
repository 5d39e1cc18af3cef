"""The reconciler's values (reconcile.py, moves.py): what it knows of a task's machine, the
operations it names, the gate that lets disruptive ones proceed, and the plan it returns."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from controlplane.store.records import JobRec, TaskRec

# Disruptive operations: they take a running task down, so they need approval (the job's
# update policy now, its TaskController in #4) and are rate limited.
DISRUPTIVE = ("restart", "move", "stop")
DESTRUCTIVE = ("move", "stop")  # rate limited, whatever their cause


@dataclass(frozen=True)
class Maintenance:
    """A maintenance that covers a machine: before its deadline the job may move its tasks away
    (its TaskController acks the moves; a job without one follows `policy`); from the deadline
    until `until` nothing of the job runs on the machine."""

    id: str
    active: bool  # the deadline has passed
    deadline: float
    until: float
    policy: str = "move"  # for jobs without a TaskController: "move" before the deadline, or "stop" at it
    # "reclaim": an opportunistic machine taken back for the entitlement `heir` (controlplane/capacity):
    # a task whose TaskController acks its reclaim stops at once, the others at the deadline; stopped,
    # it leaves the machine (pending: placed again where there is room)
    kind: str = "maintenance"
    heir: str | None = None


@dataclass(frozen=True)
class Reprofile:
    """The machine is in a batch of its entitlement's host-profile rollout (controlplane/rollouts):
    while it drains and switches, its tasks stop (each a `reprofile` operation its job's
    TaskController acks); once the new profile is applied they start again."""

    rollout: str  # the rollout's id
    phase: str  # draining, switching, starting
    what: str  # "web@1a2b3c4d -> web@5e6f7a8b"

    @property
    def stops(self) -> bool:
        return self.phase in ("draining", "switching")


@dataclass(frozen=True)
class MachineStatus:
    """What the reconciler needs to know of a task's machine."""

    id: str
    healthy: bool
    health_reason: str = ""
    profile_ready: bool = True
    desired_profile: str | None = None
    address: str = ""
    error: str = ""  # why the machine's agent rejected its desired state, if it did
    # The agent's last report of its containers since this daemon started, by (job, index);
    # None: no report yet (after a daemon restart): task states are left as they are.
    reports: Mapping[tuple[str, int], dict] | None = None
    maintenance: Maintenance | None = None
    reprofile: Reprofile | None = None


@dataclass(frozen=True)
class Op:
    kind: str  # place, start, stop, restart, move, reprofile, reclaim, lost, running, failed, delete
    index: int
    reason: str
    id: str = ""  # disruptive operations only: stable across passes, what a TaskController acks
    machine: str | None = None
    cause: str = ""  # update, machine failure, maintenance, rebalance, resize, stop, reprofile, reclaim
    version: int | None = None  # the spec version an update brings the task to

    def __str__(self) -> str:
        return f"{self.kind} #{self.index}: {self.reason}"


@dataclass
class Gate:
    """Which disruptive operations may proceed in this pass: those the job's TaskController acked
    (`approved`; None for a job without one: the built-in policy), and then only as many stops and
    moves as the rate limiter's buckets hold tokens for (`budget`)."""

    approved: frozenset[str] | None = None
    budget: int = 1_000_000
    controller_gates_stops: bool = True  # False for a whole-job stop the owner asked for

    def allow(self, op: Op, plan: "JobPlan", controller: bool = True) -> bool:
        if controller:
            plan.proposed.append(op)
            if self.approved is not None and op.id not in self.approved:
                plan.held.append(replace(op, reason=f"{op.reason}: waiting for the TaskController"))
                return False
        if op.kind in DESTRUCTIVE:
            if self.budget <= 0:
                plan.held.append(replace(op, reason=f"{op.reason}: rate limited"))
                plan.rate_limited += 1
                return False
            self.budget -= 1
            plan.destructive += 1
        return True


@dataclass
class JobPlan:
    changes: list[tuple[TaskRec | None, TaskRec | None]] = field(default_factory=list)  # (old, new); new None: delete
    ops: list[Op] = field(default_factory=list)
    proposed: list[Op] = field(default_factory=list)  # disruptive operations a TaskController must ack
    held: list[Op] = field(default_factory=list)  # disruptive operations not approved now, with why
    rate_limited: int = 0
    destructive: int = 0  # stops and moves done in this plan (tokens to take)
    waiting: list[str] = field(default_factory=list)
    place: tuple[int, ...] = ()  # task indices that need a machine (pending, lost, moved)
    job: JobRec | None = None  # the job record when it changes (e.g. stopping -> stopped)
    # the tasks as this plan leaves them: the records brought up to date by the agents' reports,
    # with the plan's own changes. What a TaskController is told is down comes from here, the
    # picture its requests were made from (issue #12: records a commit behind the reports
    # showed a task both running, with a restart asked for, and down).
    after: dict[int, TaskRec] = field(default_factory=dict)
    # the tasks as the pass found them: the records brought up to date by the agents' reports and
    # the machines' health, before this plan's own operations (what an approval is checked against)
    seen: dict[int, TaskRec] = field(default_factory=dict)
    # the ReBalancer's moves (moves.py): requests dropped (index -> why), moves begun, moves ended
    # (index, source, the move, outcome)
    dropped: dict[int, str] = field(default_factory=dict)
    begun: list[int] = field(default_factory=list)
    ended: list[tuple] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.changes or self.job or self.dropped)
