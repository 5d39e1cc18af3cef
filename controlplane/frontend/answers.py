"""What the API answers, declared as the bodies are (schema.py): the document's answer schemas are
generated from these; tests/controlplane/frontend/test_api_answers.py holds every view of a live
region to them, and Schemathesis checks every answer it gets against the document. Views are built
as dicts (views.py); these say what they hold."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from agent.models import NETWORK_MODES
from controlplane.allocator.model import LEVELS, STRATEGIES
from controlplane.opsplanner.maintenance import POLICIES as MAINTENANCE_POLICIES
from controlplane.store.records import JOB_STATES, TASK_STATES, ApiError, Endpoint

Level = Literal[LEVELS]  # type: ignore[valid-type]

Time = float  # seconds since the epoch
Strings = list[str]


class Answer(Struct, forbid_unknown_fields=True):
    pass


class Error(Answer):
    error: Literal[tuple(ApiError.STATUS)]  # type: ignore[valid-type]
    why: str
    field: Union[str, None] = None


class Health(Answer):
    ok: bool
    error: Union[str, msgspec.UnsetType] = msgspec.UNSET
    field: Union[str, None, msgspec.UnsetType] = msgspec.UNSET
    why: Union[str, msgspec.UnsetType] = msgspec.UNSET


class SpreadView(Answer):
    properties: list[Level]
    pinned_dc: Union[str, None]


class Entitlement(Answer):
    name: str
    machine_type: str
    quota: int
    profile: Union[str, None]
    owner: str
    spread: SpreadView
    shard: int
    created_at: Time
    allow_host_network: bool
    allow_controller_networks: Strings
    rollout: Annotated[Union[dict[str, Any], None], Meta(description="how a change of its profile rolls out: "
                                                         "max_unavailable, auto_rollback, deadline (null: defaults)")]
    held: Annotated[int, Meta(description="machines it holds")]
    kind: Annotated[str, Meta(description="guaranteed or opportunistic")] = "guaranteed"
    notice: Annotated[float, Meta(description="seconds of notice before an opportunistic machine is taken back")] = 120.0
    reclaim: Annotated[Union[dict[str, Any], None], Meta(description="an opportunistic entitlement's disruption "
                                                         "budget in force: max_machines, max_percent, cooldown "
                                                         "(null for a guaranteed one)")] = None
    machines: Union[Strings, msgspec.UnsetType] = msgspec.UNSET  # one entitlement's view
    jobs: Union[Strings, msgspec.UnsetType] = msgspec.UNSET
    # its profile rollout in short (null: none yet): state, from, to, machines by phase
    rollout_state: Union[dict[str, Any], None, msgspec.UnsetType] = msgspec.UNSET


class EntitlementList(Answer):
    entitlements: list[Entitlement]


class Where(Answer):
    dc: str
    msb: str
    rack: str


class Task(Answer):
    job: str
    index: int
    spec_version: int
    machine: Union[str, None]
    where: Union[Where, None]
    state: Literal[TASK_STATES]  # type: ignore[valid-type]
    reason: str
    discovery: bool
    since: Time
    moving: Union[dict[str, Any], msgspec.UnsetType] = msgspec.UNSET  # a move in progress: its copy's machine, why


class TaskTemplateView(Answer):
    image: str
    command: Strings
    env: dict[str, str]
    cpus: float
    memory_mb: int
    pids: int
    network_mode: Literal[NETWORK_MODES]  # type: ignore[valid-type]
    secret_env: Annotated[Union[dict[str, None], msgspec.UnsetType], Meta(description="names only")] = msgspec.UNSET


class RequirementsView(Answer):
    machine_type: Union[str, None]
    dc: Union[str, None]


class PreferenceView(Answer):
    property: Level
    strategy: Literal[STRATEGIES]  # type: ignore[valid-type]
    weight: float


class UpdateView(Answer):
    max_unavailable: int
    reprofile: Literal["stop", "move"]


class Operations(Answer):
    held: Annotated[Strings, Meta(description="operations a TaskController has not acknowledged yet")]
    waiting: list[Any]
    rate_limited: int


class Job(Answer):
    handle: str
    entitlement: str
    name: str
    count: int
    task: TaskTemplateView
    spec_version: int
    requirements: RequirementsView
    preferences: Union[list[PreferenceView], None]
    update: UpdateView
    controller: Union[str, None]
    controller_token: Annotated[None, Meta(description="never shown: see controller_token_set")]
    controller_token_set: bool
    state: Literal[JOB_STATES]  # type: ignore[valid-type]
    created_at: Time
    updated_at: Time
    autoscale: Annotated[Union[dict[str, Any], None], Meta(description="the autoscaling policy (as sent, with its "
                                                                      "defaults); GET .../autoscale: what the SRM does")]
    gaps: Annotated[list[int], Meta(description="indices below count + len(gaps) without a task: left by a scale-in "
                                                "that chose which tasks to stop")]
    summary: Annotated[dict[str, int], Meta(description="tasks by state")]
    message: str
    operations: Operations
    taskcontrol: Annotated[Union[dict[str, Any], None], Meta(description="the TaskController session, at the "
                                                                       "shard's leader")]
    tasks: Union[list[Task], msgspec.UnsetType] = msgspec.UNSET  # one job's view
    warnings: Union[Strings, msgspec.UnsetType] = msgspec.UNSET  # a create's or update's: what was clamped


class JobList(Answer):
    jobs: list[Job]


class ProfileView(Answer):
    desired: Union[str, None]
    applied: Union[str, None]
    hash: Annotated[Union[str, None], Meta(description="the content hash of what its agent applied")]
    ok: bool
    error: str


class Alloc(Answer):
    tasks: int
    cpus: float
    memory_mb: int


class Tombstone(Answer):
    job: str
    index: int
    cpus: float
    memory_mb: int
    since: Time


class AgentView(Answer):
    address: str
    version: str
    error: str


class Machine(Answer):
    id: str
    hostname: str
    labels: dict[str, str]
    capacity: dict[str, Any]
    entitlement: Union[str, None]
    healthy: bool
    health_reason: str
    profile: ProfileView
    alloc: Alloc
    tombstones: list[Tombstone]
    agent: AgentView
    last_heartbeat: Union[Time, None]
    tasks: Union[list[Task], msgspec.UnsetType] = msgspec.UNSET  # one machine's view
    desired_version: Union[str, msgspec.UnsetType] = msgspec.UNSET


class MachineList(Answer):
    machines: list[Machine]


class Token(Answer):
    id: str
    role: Literal["admin", "owner", "reader", "bootstrap"]
    entitlements: Strings
    created_at: Time
    expires: Union[Time, None]
    description: str
    token: Annotated[Union[str, msgspec.UnsetType], Meta(description="only in the answer that made it")] = msgspec.UNSET


class TokenList(Answer):
    tokens: list[Token]


class Revoked(Answer):
    revoked: str


class Event(Answer):
    id: str
    kind: Annotated[Literal["failure", "maintenance", "controller", "autoscale", "rebalance", "rollout", "reclaim"],
                    Meta(description="controller: a job's TaskController was not called at a refused address; "
                                     "autoscale: autoscaled jobs of a shard without fresh measurements (scale-in frozen); "
                                     "rebalance: a ReBalancer move ended; rollout: a profile rollout's batch; "
                                     "reclaim: opportunistic machines (of `scope`) taken back for `heir`")]
    machines: Strings
    start: Time
    reason: str
    duration: Union[float, None]
    deadline: Union[Time, None]
    end: Union[Time, None]
    scope: str
    policy: Union[Literal[MAINTENANCE_POLICIES], None]  # type: ignore[valid-type]
    created: Time
    heir: Annotated[Union[str, None], Meta(description="reclaim: the guaranteed entitlement its machines go to")]
    cause: Annotated[str, Meta(description="reclaim: demand, forecast or failure")]


class EventList(Answer):
    events: list[Event]


class MaintenanceTask(Answer):
    job: str
    index: int
    machine: Union[str, None]
    state: Literal[TASK_STATES]  # type: ignore[valid-type]


class Maintenance(Event):
    phase: Literal["scheduled", "in progress", "over"]
    until: Time
    policy_default: bool
    tasks: list[MaintenanceTask]


class MaintenanceList(Answer):
    maintenance: list[Maintenance]


class Discovery(Answer):
    job: str
    endpoints: list[Endpoint]  # the discovery records as the store keeps them


class Registration(Answer):
    machine_id: str
    credential: str


class ProfileSpec(Answer):
    name: str
    hash: str
    sections: dict[str, Any]


class DesiredState(Answer):
    version: str
    profile: Union[str, None]
    tasks: Annotated[list[dict[str, Any]], Meta(description="the agent's TaskSpec JSON")]
    profile_spec: Union[ProfileSpec, msgspec.UnsetType] = msgspec.UNSET


class HeartbeatReply(Answer):
    ok: bool
    interval: float
    # seconds without a heartbeat before the region fails the machine: the agent gives a replica
    # that does not answer half of it before trying another
    timeout: Union[float, msgspec.UnsetType] = msgspec.UNSET
    resend: Union[bool, msgspec.UnsetType] = msgspec.UNSET
    heartbeat_to: Union[str, msgspec.UnsetType] = msgspec.UNSET


class ShutdownReply(Answer):
    ok: bool
    maintenance: str
    until: Time


class Relayed(Answer):
    ok: bool


class ShardView(Answer):
    shard: int
    leader: Union[str, None]
    leader_url: Union[str, None]
    epoch: Union[int, None]
    entitlements: Strings
    tasks: int
    elected_at: Union[float, None, msgspec.UnsetType] = msgspec.UNSET  # on a process that leads it
    first_commit_at: Union[float, None, msgspec.UnsetType] = msgspec.UNSET


class Cluster(Answer):
    region: str
    self: Union[dict[str, Any], None]
    members: list[dict[str, Any]]
    shards: list[ShardView]


class Measured(Answer):
    load: Union[float, None]  # cores used, or the metric's value; None: nothing measured
    age: Union[float, None]  # seconds; None: never measured
    running: int
    per_task: float  # the load one task should carry


class ResizeEvent(Answer):
    at: Time
    was: int  # the size before
    to: int
    reason: str
    stopped: Union[list[int], msgspec.UnsetType] = msgspec.UNSET  # a scale-in's chosen tasks


class AutoscaleStatus(Answer):
    job: str
    policy: Union[dict[str, Any], None]  # None: the SRM never resizes the job
    size: int
    interval: float  # seconds between the SRM's passes
    reason: str
    events: Annotated[list[ResizeEvent], Meta(description="the last resizes, oldest first")]
    history: Annotated[list[tuple[float, int, int]], Meta(description="[t, size, recommended] at each change")]
    recommended: Union[int, None, msgspec.UnsetType] = msgspec.UNSET
    reactive: Union[int, None, msgspec.UnsetType] = msgspec.UNSET
    predictive: Union[int, None, msgspec.UnsetType] = msgspec.UNSET
    stale: Union[bool, None, msgspec.UnsetType] = msgspec.UNSET
    clamped: Union[str, msgspec.UnsetType] = msgspec.UNSET
    decided_at: Union[Time, None, msgspec.UnsetType] = msgspec.UNSET
    measured: Union[Measured, None, msgspec.UnsetType] = msgspec.UNSET
    forecast: Union[float, None, msgspec.UnsetType] = msgspec.UNSET  # cores: the history's peak ahead
    forecast_trust: Union[float, None, msgspec.UnsetType] = msgspec.UNSET  # the share of a forecast rise taken as a floor
    startup_seconds: Union[float, None, msgspec.UnsetType] = msgspec.UNSET
    budget_left: Union[int, None, msgspec.UnsetType] = msgspec.UNSET  # size changes left this hour
