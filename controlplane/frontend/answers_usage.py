"""What the API answers about usage (issue #25, #35): the fleet, a job's or an entitlement's usage
now and over time, each task's of a job, and the figures one replica's book holds, which the
others ask for (usage/peers.py). The rest: answers.py, whose docstring says how they are used."""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct

from controlplane.frontend.answers import Answer, Strings, Time
from controlplane.store.records import TASK_STATES


class Resources(Answer):
    cpus: float
    memory_mb: int


class Used(Answer):
    cpus: float  # cores, what the tasks used
    memory_mb: int
    machines_reporting: int


class HostsUsed(Answer):
    cpus: float  # cores, what the hosts used (their tasks, their daemons, the rest)
    memory_mb: int
    power_w: Union[float, None]  # None: no machine of the cell measures power
    machines_with_power: int


class FleetCell(Answer):
    machines: int
    healthy: int
    maintenance: int  # in maintenance now
    cpus: float
    memory_mb: int
    reserved: Resources
    used: Used
    hosts_used: HostsUsed
    dc: Union[str, msgspec.UnsetType] = msgspec.UNSET  # the dimensions asked for (?by=)
    msb: Union[str, msgspec.UnsetType] = msgspec.UNSET
    entitlement: Union[str, msgspec.UnsetType] = msgspec.UNSET  # "": the free pool
    profile: Union[str, msgspec.UnsetType] = msgspec.UNSET  # the profile applied ("": none)
    type: Union[str, msgspec.UnsetType] = msgspec.UNSET


class PoolCell(Answer):
    type: str
    dc: str
    machines: int
    usable: int  # healthy and not in maintenance


class EntitlementFit(Answer):
    held: int
    quota: int
    largest_task: Resources  # on a machine it holds, or one of the pool it may still take
    largest_on_held: Resources


class Fleet(Answer):
    by: Strings
    cells: list[FleetCell]
    free_pool: list[PoolCell]
    entitlements: dict[str, EntitlementFit]


class CurrentUsage(Answer):
    cpus: float
    memory_mb: int
    tasks_reporting: int


class TaskUsageView(Answer):
    """One task of a job as its agent last measured it (figures null: not measured yet)."""

    index: int
    machine: Union[str, None]  # None: not placed
    state: Literal[TASK_STATES]  # type: ignore[valid-type]
    cpus: Union[float, None]  # cores
    memory_mb: Union[int, None]
    measured_at: Annotated[Union[Time, None], Meta(description="when the heartbeat that carried it came")]


class UsageHistory(Answer):
    reserved: Resources
    current: Union[CurrentUsage, None]  # None: no task reports usage now
    since: int
    step: int
    fields: Strings
    points: list[tuple[int, float, float, int, int]]  # as `fields` names them; steps with nothing measured left out
    job: Union[str, msgspec.UnsetType] = msgspec.UNSET
    count: Union[int, msgspec.UnsetType] = msgspec.UNSET
    tasks: Annotated[Union[list[TaskUsageView], msgspec.UnsetType],
                     Meta(description="a job's with ?tasks=1: each task, by index")] = msgspec.UNSET
    entitlement: Union[str, msgspec.UnsetType] = msgspec.UNSET
    quota: Union[int, msgspec.UnsetType] = msgspec.UNSET
    machine_type: Union[str, msgspec.UnsetType] = msgspec.UNSET


class TaskFigure(Struct, array_like=True, forbid_unknown_fields=True):
    """[job, index, machine, millicores, MiB, when its heartbeat came, millicores smoothed], as the
    book keeps them."""

    job: str
    index: int
    machine: str
    cpu_m: int
    memory_mb: int
    at: Time
    cpu_avg_m: Union[int, None] = None  # None: a replica of a release before it (its cpu_m then)


class TaskFigures(Answer):
    """The task figures one replica's book holds (GET /v1/internal/usage/tasks)."""

    tasks: list[TaskFigure]
