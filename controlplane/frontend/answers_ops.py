"""What the API answers about operations in progress and what they would do: profile rollouts,
TaskControl dry runs, the ReBalancer (the rest: answers.py, whose docstring says how they are used)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from controlplane.frontend.answers import Answer, Strings, Time


class RolloutMachine(Answer):
    id: str
    msb: str
    phase: Annotated[str, Meta(description="pending, draining, switching, starting, done, failed ('': not in it)")]
    batch: int
    holds: Annotated[str, Meta(description="the profile its agent reports applied (name@hash)")]
    wants: Annotated[str, Meta(description="the profile it should hold now")]
    why: str


class Rollout(Answer, rename={"from_": "from"}):
    entitlement: str
    id: str
    state: Literal["rolling", "paused", "rolling_back", "done", "rolled_back"]
    from_: str
    to: str
    why: Annotated[str, Meta(description="why it paused or rolls back")]
    policy: dict[str, Any]
    machines: list[RolloutMachine]
    batches: list[dict[str, Any]]
    created: Time
    updated: Time


class DryRunRound(Answer):
    round: int
    ops: Annotated[list[dict[str, Any]], Meta(description="the operations begun: id, kind, index, machine, reason")]
    tasks: list[int]


class DryRun(Answer):
    job: str
    spec_version: int
    rounds: list[DryRunRound]
    calls: Annotated[int, Meta(description="calls to the job's TaskController, each marked dryRun: true")]
    stuck: Annotated[str, Meta(description="what would not proceed after the last round ('' none)")]
    summary: Strings


class MaintenanceDryRun(Answer):
    machines: Strings
    deadline: Time
    jobs: list[DryRun]
    summary: Strings


class PlannedMove(Answer):
    job: str
    index: int
    source: str  # the machine the task is on
    target: str  # the machine it would move to
    goal: str
    why: str
    # a plan's move: what the job's TaskController answered a dry-run call about it
    taskcontrol: Union[str, msgspec.UnsetType] = msgspec.UNSET


class RebalancePlan(Answer):
    entitlement: Union[str, None]  # None: every entitlement
    goals: Annotated[dict[str, dict[str, Any]], Meta(description="each goal's score before and after")]
    entitlements: dict[str, dict[str, Any]]
    moves: list[PlannedMove]
    freed: Annotated[Strings, Meta(description="machines the moves would empty, for the free pool")]
    groups: Annotated[list[dict[str, Any]], Meta(description="the (entitlement, MSB) groups solved: size, solver "
                                                             "status, seconds")]
    summary: Annotated[Strings, Meta(description="the plan in words: a line a goal, in their order (compaction: a line "
                                                         "an entitlement)")]
    violations: Annotated[Strings, Meta(description="rules the moves would break (none: every plan is checked)")] = []
    taken: Annotated[dict[str, str], Meta(description="free machines swaps would take, and for which entitlement")] = {}
    seconds: float = 0.0  # the plan's wall time
    max_moves: Union[int, None] = None  # the round's move budget (?max_moves=N); None: none


class RebalanceRound(RebalancePlan):
    round: str = ""  # the round's id, in each request it wrote
    requested: int = 0  # moves requested of the jobs' shard leaders


class RebalanceStatus(Answer):
    continuous: Annotated[dict[str, Any], Meta(description="the continuous mode: on for all, or for entitlements")]
    moving: Annotated[list[dict[str, Any]], Meta(description="tasks moving now (make-before-break)")]
    requested: int  # moves requested and not begun
    recent: Annotated[list[dict[str, Any]], Meta(description="the last moves' outcomes, newest first")]


class CapacityReclaim(Answer):
    id: str
    entitlement: Annotated[str, Meta(description="the opportunistic entitlement its machines are taken from")]
    heir: Annotated[Union[str, None], Meta(description="the guaranteed entitlement they go to (none: to the free pool, "
                                                       "for the reserve)")]
    cause: str
    machines: Strings
    left: Annotated[int, Meta(description="of its machines, those the opportunistic entitlement holds no more")]
    start: Time
    deadline: Time
    end: Union[Time, None]
    phase: Literal["notice", "stopping", "over"]
    reason: str


class Capacity(Answer):
    paused: Annotated[bool, Meta(description="no reclaim begins (twinectl capacity pause); those begun go on")]
    reserve: Annotated[int, Meta(description="free machines per machine type and dc that opportunistic entitlements "
                                             "leave free for guaranteed growth, refilled by reclaims with notice "
                                             "(twinectl capacity reserve)")]
    open: list[CapacityReclaim]
    recent: Annotated[list[CapacityReclaim], Meta(description="the last reclaims over, newest first (at most 20)")]


class CapacityHour(Answer):
    hour: Annotated[Time, Meta(description="the hour's start")]
    lead: Annotated[int, Meta(description="hours ahead of the hour now")]
    expected: Annotated[Union[int, None], Meta(description="the machines the forecast expects available")]
    method: Annotated[Union[str, None], Meta(description="daily (the day before's shape at today's level) or "
                                                         "persistence (no day before: what is available now)")]
    samples: Annotated[int, Meta(description="the forecast's past errors the lines are drawn from")]
    p99: Annotated[Union[int, None], Meta(description="machines available with 99 % probability; None: no "
                                                      "history yet")]
    p99_measured: Annotated[bool, Meta(description="false: fewer than 100 errors, the line is the worst seen")]
    p999: Union[int, None]
    p999_measured: Annotated[bool, Meta(description="false: fewer than 1,000 errors, the line is the worst seen")]
    buffer: Annotated[int, Meta(description="the group's failure-domain buffer: the guaranteed machines of its "
                                            "largest MSB, lent to opportunistic work without a promise")]
    offered: Annotated[Union[int, None], Meta(description="the SLO offered: the 99 % line less the buffer")]


class CapacityGroup(Answer):
    group: Annotated[str, Meta(description="machine type/dc")]
    now: Annotated[dict[str, int], Meta(description="machines, guaranteed, opportunistic, free, reclaiming, "
                                                    "available (free + opportunistic, not reclaiming), buffer")]
    hours: list[CapacityHour]


class CapacityForecast(Answer):
    levels: list[float]
    offered_level: float
    history_hours: Annotated[int, Meta(description="hours of the pool's history kept (8 weeks at most)")]
    groups: list[CapacityGroup]


class CapacityPast(Answer):
    """An hour kept (a figure missing from an hour kept before it was counted: 0)."""

    hour: Annotated[Time, Meta(description="the hour's start")]
    machines: int
    guaranteed: int
    opportunistic: int
    free: int
    reclaiming: int
    available: Annotated[int, Meta(description="the hour's least (the others: its most)")]
    buffer: Annotated[int, Meta(description="the failure-domain buffer (0 in hours kept before it was)")]
    offered: Annotated[Union[int, None], Meta(description="the line offered for the hour earliest; None: none was")]


class CapacityPastGroup(Answer):
    group: Annotated[str, Meta(description="machine type/dc")]
    hours: list[CapacityPast]


class CapacityHistory(Answer):
    since: Annotated[Time, Meta(description="the first hour asked for")]
    step: Annotated[int, Meta(description="seconds an hour covers: 3600")]
    groups: list[CapacityPastGroup]


class CapacityMiss(Answer):
    hour: Time
    offered: int
    available: int
    lead: int


class CapacityKept(Answer):
    group: str
    judged: Annotated[int, Meta(description="hours with an offer made for them")]
    delivered: Annotated[int, Meta(description="of those, hours whose least available reached the offer")]
    ratio: Union[float, None]
    missed: Annotated[list[CapacityMiss], Meta(description="the last hours missed (at most 20)")]


class CapacitySlo(Answer):
    objective: float
    since: Time
    groups: list[CapacityKept]
    reclaims: Annotated[dict[str, dict[str, Any]], Meta(description="per cause (demand, forecast, failure): "
                                                                    "reclaims, machines, notice_s, over_early")]
