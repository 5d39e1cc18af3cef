"""The request bodies of the /v1 API, declared once (issue #11): msgspec types from which the
OpenAPI document's request schemas are generated (openapi.py), and against which every body is
checked before the daemon acts on it (app.py: `checked`). A body the document would refuse is
refused with a 400 naming the field; the parsers in records.py then check what a schema cannot say
(the state of the region, one field against another).

Names, bounds and patterns come from the code that enforces them (records.NAME, agent/models.py's
task limits), so the document and the daemon cannot drift apart; tests/controlplane/frontend/test_api_fuzz.py
runs Schemathesis against the served document to prove it.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from agent.models import (_ENV, IMAGE, MAX_ARGS, MAX_COMMAND, MAX_CPUS, MAX_ENV, MAX_ENV_SIZE, MEMORY_MB, NETWORK_MODES,
                          PIDS)
from controlplane.broker.agents import MACHINE_ID, MAX_LABEL
from controlplane.allocator.model import LEVELS, STRATEGIES
from controlplane.opsplanner.maintenance import MAX_DURATION as MAX_MAINTENANCE
from controlplane.opsplanner.maintenance import POLICIES as MAINTENANCE_POLICIES
from controlplane.store.records import (JOB_STATES, MAX_OWNER, NAME, TASK_STATES,
                                  ApiError, Endpoint)

Name = Annotated[str, Meta(pattern=NAME.pattern, description="lower case letters, digits, '_.-' (1-63)")]
Label = Annotated[str, Meta(min_length=1, max_length=253)]
Count = Annotated[int, Meta(ge=0, le=10_000)]
EnvName = Annotated[str, Meta(pattern=_ENV.pattern)]
EnvValue = Union[Annotated[str, Meta(max_length=MAX_ENV_SIZE)], int, float]
Env = Annotated[dict[EnvName, EnvValue], Meta(max_length=MAX_ENV, description=f"at most {MAX_ENV} variables "
                                              f"of {MAX_ENV_SIZE} characters in all")]
Seconds = Annotated[float, Meta(gt=0, lt=1e300)]
Level = Literal[LEVELS]  # type: ignore[valid-type]


class Spread(Struct, forbid_unknown_fields=True):
    # a list only: msgspec 0.22 aborts the process at exit (a double free) once a type holding
    # Union[list[...], <str with a pattern>] has been used, so the "dc,msb" string form is not
    # part of the document (twinectl sends a list)
    properties: list[Level] = msgspec.field(default_factory=lambda: ["dc", "msb"])
    pinned_dc: Union[Label, None] = None


class EntitlementPatch(Struct, forbid_unknown_fields=True):
    quota: Union[Annotated[int, Meta(ge=0, le=1_000_000)], msgspec.UnsetType] = msgspec.UNSET
    profile: Union[Name, None, msgspec.UnsetType] = msgspec.UNSET
    owner: Union[Annotated[str, Meta(max_length=MAX_OWNER)], msgspec.UnsetType] = msgspec.UNSET
    spread: Union[Spread, msgspec.UnsetType] = msgspec.UNSET
    allow_host_network: Union[bool, msgspec.UnsetType] = msgspec.UNSET


class EntitlementSpec(Struct, forbid_unknown_fields=True):
    name: Name
    machine_type: Name
    quota: Annotated[int, Meta(ge=0, le=1_000_000)]
    profile: Union[Name, None] = None
    owner: Annotated[str, Meta(max_length=MAX_OWNER)] = ""
    spread: Union[Spread, msgspec.UnsetType] = msgspec.UNSET
    allow_host_network: Annotated[bool, Meta(description="its jobs may use network_mode host (admin policy)")] = False


class EntitlementMove(Struct, forbid_unknown_fields=True):
    shard: Annotated[int, Meta(ge=0, le=1_000_000)]


class TaskTemplate(Struct, forbid_unknown_fields=True):
    image: Annotated[str, Meta(pattern=IMAGE.pattern, description="an image reference: [registry/]name[:tag][@digest]")]
    command: Union[Annotated[list[Annotated[str, Meta(max_length=MAX_COMMAND)]], Meta(max_length=MAX_ARGS)],
                   Annotated[str, Meta(max_length=MAX_COMMAND)]] = []
    env: Env = {}
    secret_env: Annotated[dict[EnvName, Union[Annotated[str, Meta(max_length=MAX_ENV_SIZE)], int, float, None]],
                          Meta(max_length=MAX_ENV, description="never shown by the API (null in its answers); "
                               "null in an update keeps the current value")] = {}
    cpus: Annotated[float, Meta(gt=0, le=MAX_CPUS)] = 0.5
    memory_mb: Annotated[int, Meta(ge=MEMORY_MB[0], le=MEMORY_MB[1])] = 128
    pids: Annotated[int, Meta(ge=PIDS[0], le=PIDS[1])] = 256
    network_mode: Annotated[Literal[NETWORK_MODES],  # type: ignore[valid-type]
                            Meta(description="host: only in an entitlement with allow_host_network")] = "bridge"


class Requirements(Struct, forbid_unknown_fields=True):
    machine_type: Union[Label, None] = None
    dc: Union[Label, None] = None


class Preference(Struct, forbid_unknown_fields=True):
    property: Level = "msb"
    strategy: Literal[STRATEGIES] = "spread"  # type: ignore[valid-type]
    weight: Annotated[float, Meta(ge=0, lt=1e300)] = 1.0


class Update(Struct, forbid_unknown_fields=True):
    max_unavailable: Annotated[int, Meta(ge=1, le=10_000)] = 1


class JobSpec(Struct, forbid_unknown_fields=True):
    entitlement: Name
    name: Name
    count: Count
    task: TaskTemplate
    requirements: Union[Requirements, None] = None
    preferences: Union[list[Preference], None] = None
    update: Union[Update, None] = None
    controller: Union[Annotated[str, Meta(pattern=r"^https?://", max_length=2048)], None] = None
    controller_token: Union[Annotated[str, Meta(pattern=r"^[\x21-\x7e]{0,512}$(?!\n)")], None] = None


class Resize(Struct, forbid_unknown_fields=True):
    count: Count


class TokenSpec(Struct, forbid_unknown_fields=True):
    role: Literal["admin", "owner", "reader", "bootstrap"]
    entitlements: Annotated[list[Name], Meta(max_length=1000)] = []
    expires_in: Union[Annotated[float, Meta(gt=0, le=10 * 365 * 86400)], None] = None
    description: Annotated[str, Meta(max_length=256)] = ""


class MaintenanceSpec(Struct, forbid_unknown_fields=True):
    start: Seconds
    duration: Annotated[float, Meta(gt=0, le=MAX_MAINTENANCE)]
    machines: Union[Annotated[list[Label], Meta(min_length=1, max_length=100_000)], None] = None
    dc: Union[Label, None] = None
    msb: Union[Label, None] = None
    rack: Union[Label, None] = None
    deadline: Union[Seconds, None] = None
    policy: Union[Literal[MAINTENANCE_POLICIES], None] = None  # type: ignore[valid-type]
    reason: Annotated[str, Meta(max_length=500)] = ""


# -- what agents send (docs/api.md, "Agents"): unknown fields are allowed where a newer agent may
# say more (the daemon reads only these), never in what it stores (labels, capacity)

AgentLabel = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL)]
AgentText = Union[Annotated[str, Meta(max_length=MAX_LABEL)], None]


class MachineLabels(Struct):
    region: AgentLabel
    dc: AgentLabel
    msb: AgentLabel
    rack: AgentLabel
    machine_type: AgentLabel


class Capacity(Struct, forbid_unknown_fields=True):
    cpus: Annotated[float, Meta(gt=0, le=65536)]
    memory_mb: Annotated[int, Meta(gt=0, le=2**40, description="MiB")]
    disk_gb: Annotated[float, Meta(ge=0, le=2**40)] = 0.0
    hugepage_sizes_kb: Annotated[list[Annotated[int, Meta(gt=0, le=2**30)]], Meta(max_length=16)] = []
    cgroup_version: Literal[1, 2] = 1
    supports: Annotated[list[Annotated[str, Meta(min_length=1, max_length=64)]], Meta(max_length=64)] = []


class AgentRegister(Struct, forbid_unknown_fields=True):
    machine_id: Annotated[str, Meta(pattern=MACHINE_ID.pattern)]
    labels: MachineLabels
    capacity: Capacity
    hostname: AgentText = None
    address: AgentText = None
    version: AgentText = None


class TaskReport(Struct):
    job: Annotated[str, Meta(min_length=1, max_length=127)]
    index: Annotated[int, Meta(ge=0, le=1_000_000)]
    spec_version: Annotated[int, Meta(ge=0)] = 0
    state: Annotated[str, Meta(max_length=32)] = ""
    exit_code: Union[int, None] = None
    restarts: Annotated[int, Meta(ge=0)] = 0
    error: Annotated[str, Meta(max_length=65536)] = ""


class HealthReport(Struct):
    ok: bool = False
    problems: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=256)] = []


class ProfileReport(Struct):
    name: Union[Annotated[str, Meta(max_length=4096)], None] = None
    ok: bool = True
    error: Annotated[str, Meta(max_length=65536)] = ""


class Heartbeat(Struct):
    machine_id: AgentText = None
    seq: Annotated[int, Meta(ge=0)] = 0
    desired_version: Union[Annotated[str, Meta(max_length=128)], None] = None
    desired_error: Union[Annotated[str, Meta(max_length=65536)], None] = None
    health: Union[HealthReport, None] = None
    profile: Union[ProfileReport, None] = None
    digest: Union[Annotated[str, Meta(max_length=128)], None] = None
    tasks: Union[Annotated[list[TaskReport], Meta(max_length=100_000, description="left out when the digest is "
                                                  "the one last accepted")], None] = None


class Shutdown(Struct, forbid_unknown_fields=True):
    reason: Literal["reboot"]


class RelayReport(Struct):
    tasks: Union[list[dict[str, Any]], None] = None  # the agent's report, as its heartbeat had it (checked there)
    error: Union[str, None] = ""
    at: Union[float, None] = None  # when the relaying member last knew the report current (wall clock)


class Relay(Struct, forbid_unknown_fields=True, rename={"from_": "from"}):
    from_: Label
    seen: list[Label] = []
    reports: dict[Label, RelayReport] = {}


# query parameters, bounded here once (app.py checks them, openapi.py declares them)
MAX_VERSION = 64  # characters of a desired state's ?version
MAX_WAIT_ASKED = 3600  # seconds a long poll's ?wait may ask for (at most --max-long-poll are waited)
ALL = ("0", "1", "true", "false")  # ?all= of GET /v1/maintenance

BODIES: dict[str, type] = {t.__name__: t for t in (EntitlementSpec, EntitlementPatch, EntitlementMove, JobSpec,
                                                   Resize, TokenSpec, MaintenanceSpec, Relay, AgentRegister,
                                                   Heartbeat, Shutdown)}

_AT = re.compile(r" - at (?:`key` in )?`\$(?P<path>[^`]*)`$")
_FIELD = re.compile(r"(?:unknown|required) field `(?P<name>[^`]+)`")


def checked(data: Any, schema: type) -> Any:
    """`data` (a decoded JSON body) as it is, if it fits `schema`; else a 400 naming the field."""
    try:
        try:
            msgspec.convert(data, schema, strict=True)
        except msgspec.ValidationError as e:
            if "Expected `int`, got `float`" not in str(e):
                raise
            # JSON has one number type: 3.0 is the integer 3 (as JSON Schema says); taken as it
            data = _integral(data)
            msgspec.convert(data, schema, strict=True)
    except RecursionError:
        raise ApiError("invalid", "body", "nested too deep") from None
    except msgspec.ValidationError as e:
        field = _field(str(e))
        if " - at `key` in " in str(e):
            field = _bad_key(data, field, str(e)) or field
        raise ApiError("invalid", field, _why(str(e))) from None
    return data


def decoded(raw: bytes, schema: type) -> Any:
    """`raw` (a JSON body) decoded into `schema`'s type in one pass; else a 400 naming the field."""
    try:
        return msgspec.json.decode(raw, type=schema, strict=True)
    except RecursionError:
        raise ApiError("invalid", "body", "nested too deep") from None
    except msgspec.ValidationError as e:
        raise ApiError("invalid", _field(str(e)), _why(str(e))) from None
    except msgspec.DecodeError as e:
        raise ApiError("invalid", "body", f"the body is not JSON within limits: {e}") from None


def _integral(v: Any) -> Any:
    """Floats with no fraction as ints, all through `v`, but for environment values (strings for
    the task: 1.0 stays "1.0" there)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    if isinstance(v, list):
        return [_integral(x) for x in v]
    if isinstance(v, dict):
        return {k: x if k in ("env", "secret_env") else _integral(x) for k, x in v.items()}
    return v


def _bad_key(data: Any, path: str | None, message: str) -> str | None:
    """The key a pattern refused (msgspec names the object, not the key): `task.env.1BAD`."""
    obj = data
    for part in (path or "").split("."):
        obj = obj.get(part) if isinstance(obj, dict) and part else obj
    pattern = re.search(r"matching regex ('.*') - at ", message)
    if not isinstance(obj, dict) or pattern is None:
        return None
    regex = ast.literal_eval(pattern.group(1))  # msgspec shows the pattern as Python's repr of it
    bad = next((k for k in obj if not re.search(regex, k)), None)
    return None if bad is None else f"{path}.{bad}"


def _field(message: str) -> str | None:
    """`Object contains unknown field `x` - at `$.task`` -> task.x; `... - at `$.preferences[0].weight`` ->
    preferences[0].weight."""
    m = _AT.search(message)
    path = m.group("path").lstrip(".").removesuffix("[...]") if m else ""
    if f := _FIELD.search(message):
        path = f"{path}.{f.group('name')}" if path else f.group("name")
    return path or None


def _why(message: str) -> str:
    return _AT.sub("", message).replace("`", "'")





# -- answers ---------------------------------------------------------------------------------
# What the API answers, declared as the bodies are (the document's answer schemas are generated
# from these; tests/controlplane/frontend/test_api_answers.py holds every view of a live region to them, and
# Schemathesis checks every answer it gets against the document). Views are built as dicts
# (app.py); these say what they hold.

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
    held: Annotated[int, Meta(description="machines it holds")]
    machines: Union[Strings, msgspec.UnsetType] = msgspec.UNSET  # one entitlement's view
    jobs: Union[Strings, msgspec.UnsetType] = msgspec.UNSET


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
    summary: Annotated[dict[str, int], Meta(description="tasks by state")]
    message: str
    operations: Operations
    taskcontrol: Annotated[Union[dict[str, Any], None], Meta(description="the TaskController session, at the "
                                                                       "shard's leader")]
    tasks: Union[list[Task], msgspec.UnsetType] = msgspec.UNSET  # one job's view


class JobList(Answer):
    jobs: list[Job]


class ProfileView(Answer):
    desired: Union[str, None]
    applied: Union[str, None]
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
    kind: Literal["failure", "maintenance"]
    machines: Strings
    start: Time
    reason: str
    duration: Union[float, None]
    deadline: Union[Time, None]
    end: Union[Time, None]
    scope: str
    policy: Union[Literal[MAINTENANCE_POLICIES], None]  # type: ignore[valid-type]
    created: Time


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


ANSWERS: dict[str, type] = {t.__name__: t for t in (
    Error, Health, Entitlement, EntitlementList, Task, Job, JobList, Machine, MachineList, Token, TokenList, Revoked,
    Event, EventList, Maintenance, MaintenanceList, Discovery, Registration, DesiredState, HeartbeatReply,
    ShutdownReply, Relayed, Cluster)}


def components() -> dict[str, Any]:
    """The bodies' and the answers' JSON schemas, for the OpenAPI document's components."""
    _, defs = msgspec.json.schema_components([*BODIES.values(), *ANSWERS.values()],
                                             ref_template="#/components/schemas/{name}")
    return defs


def answers_markdown() -> str:
    """The answers' fields as docs/api.md lists them ("Answers"), made from the types above
    (tests/controlplane/frontend/test_api_document.py checks the docs hold exactly this)."""
    lines = []
    parts = [t for t in globals().values() if isinstance(t, type) and issubclass(t, Answer) and t is not Answer]
    for t in [*parts, Endpoint]:  # and the store's record an answer holds as it is
        name = t.__name__
        fields = t.__struct_fields__ if t in parts else tuple(f.name for f in dataclasses.fields(t))
        unset = _optional(t) if t in parts else set()
        required = [f for f in fields if f not in unset]
        optional = [f for f in fields if f in unset]
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
