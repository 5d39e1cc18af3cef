"""Every answer type by name (the OpenAPI document's answer schemas: schema.py), and the answers'
fields as docs/api.md lists them, made from the answer types (answers.py, answers_usage.py,
answers_ops.py)."""

from __future__ import annotations

import dataclasses

import msgspec

from controlplane.frontend import answers, answers_ops, answers_usage
from controlplane.frontend.answers import (Answer, AutoscaleStatus, Cluster, DesiredState, Discovery, Entitlement,
                                           EntitlementList, Error, Event, EventList, Health, HeartbeatReply, Job,
                                           JobList, Machine, MachineList, Maintenance, MaintenanceList, Registration,
                                           Relayed, Revoked, ShutdownReply, Task, Token, TokenList)
from controlplane.frontend.answers_usage import Fleet, TaskFigures, UsageHistory
from controlplane.frontend.answers_ops import (Capacity, CapacityForecast, CapacityHistory, CapacitySlo, DryRun,
                                               MaintenanceDryRun, RebalancePlan, RebalanceRound, RebalanceStatus, Rollout)
from controlplane.store.records import Endpoint

ANSWERS: dict[str, type] = {t.__name__: t for t in (
    Error, Health, Entitlement, EntitlementList, Rollout, DryRun, MaintenanceDryRun, Task, Job, JobList, Machine,
    MachineList, Token, TokenList, Revoked, Event, EventList, Maintenance, MaintenanceList, Discovery, Registration,
    DesiredState, HeartbeatReply, ShutdownReply, Relayed, Cluster, Fleet, UsageHistory, TaskFigures,
    AutoscaleStatus, RebalancePlan, RebalanceRound, RebalanceStatus, Capacity, CapacityForecast,
    CapacitySlo, CapacityHistory)}


def answers_markdown() -> str:
    """The answers' fields as docs/api.md lists them ("Answers"), made from the types of answers*.py
    (tests/controlplane/frontend/test_api_document.py checks the docs hold exactly this)."""
    lines = []
    parts = [t for module in (answers, answers_usage, answers_ops) for t in vars(module).values() if isinstance(t, type)
             and issubclass(t, Answer) and t is not Answer and t.__module__ == module.__name__]
    for t in [*parts, Endpoint]:  # and the store's record an answer holds as it is
        name = t.__name__
        fields = t.__struct_fields__ if t in parts else tuple(f.name for f in dataclasses.fields(t))
        unset = _optional(t) if t in parts else set()
        wire = dict(zip(t.__struct_fields__, t.__struct_encode_fields__)) if t in parts else {}  # renamed: as sent
        required = [wire.get(f, f) for f in fields if f not in unset]
        optional = [wire.get(f, f) for f in fields if f in unset]
        line = f"- `{name}`: " + ", ".join(f"`{f}`" for f in required)
        if optional:
            line += "; sometimes " + ", ".join(f"`{f}`" for f in optional)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _optional(t: type) -> set[str]:
    """The fields an answer of type `t` may leave out (their default is UNSET)."""
    defaults = dict(zip(t.__struct_fields__[len(t.__struct_fields__) - len(t.__struct_defaults__):],
                        t.__struct_defaults__))
    return {f for f, d in defaults.items() if d is msgspec.UNSET}
