"""The request bodies of the /v1 API, declared once (issue #11): msgspec types from which the
OpenAPI document's request schemas are generated (openapi.py), and against which every body is
checked before the daemon acts on it (body.py: `checked`). A body the document would refuse is
refused with a 400 naming the field; the parsers in store/records.py then check what a schema
cannot say (the state of the region, one field against another). The answers are declared beside
them (answers.py).

Names, bounds and patterns come from the code that enforces them (records.NAME; the task's own
model, agent/models.py's TaskBody, which the agent decodes its tasks with), so the document and the
daemon cannot drift apart; tests/controlplane/frontend/test_api_fuzz.py runs Schemathesis against
the served document to prove it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from agent.decoding import error_path, error_why, field_and_why
from controlplane.frontend.answersdoc import ANSWERS, answers_markdown  # noqa: F401 - the document's, with the bodies
from agent.models import MAX_ENV, MAX_ENV_SIZE, EnvName, TaskBody, Usage
from controlplane.broker.agents import MACHINE_ID, MAX_LABEL
from controlplane.allocator.model import LEVELS, STRATEGIES
from controlplane.opsplanner.maintenance import MAX_DURATION as MAX_MAINTENANCE
from controlplane.opsplanner.maintenance import POLICIES as MAINTENANCE_POLICIES
from controlplane.store.records import MAX_OWNER, NAME, ApiError

Name = Annotated[str, Meta(pattern=NAME.pattern, description="lower case letters, digits, '_.-' (1-63)")]
Label = Annotated[str, Meta(min_length=1, max_length=253)]
Count = Annotated[int, Meta(ge=0, le=10_000)]
Seconds = Annotated[float, Meta(gt=0, lt=1e300)]
Networks = Annotated[list[Annotated[str, Meta(min_length=1, max_length=64)]],
                     Meta(max_length=64, description="networks (CIDR) its jobs' TaskControllers may be at although "
                          "controld refuses them otherwise: loopback, link-local, the control plane's own (admin policy)")]
Level = Literal[LEVELS]  # type: ignore[valid-type]


class Spread(Struct, forbid_unknown_fields=True):
    # a list only: msgspec 0.22 aborts the process at exit (a double free) once a type holding
    # Union[list[...], <str with a pattern>] has been used, so the "dc,msb" string form is not
    # part of the document (twinectl sends a list)
    properties: list[Level] = msgspec.field(default_factory=lambda: ["dc", "msb"])
    pinned_dc: Union[Label, None] = None


class RolloutPolicy(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """How a change of the entitlement's host profile reaches its machines (controlplane/rollouts)."""

    max_unavailable: Union[Annotated[int, Meta(ge=1, le=10_000, description="machines switched at once (default 1)")],
                           msgspec.UnsetType] = msgspec.UNSET
    auto_rollback: Union[Annotated[bool, Meta(description="a failed batch rolls the changed machines back "
                                              "(default true); else the rollout pauses")], msgspec.UnsetType] = msgspec.UNSET
    deadline: Union[Annotated[float, Meta(ge=1, le=86_400, description="seconds a machine has to apply the profile, "
                                          "and then its tasks to run again (default 300)")], msgspec.UnsetType] = msgspec.UNSET


Notice = Annotated[float, Meta(ge=0, le=3600, description="seconds of advance notice its TaskControllers get "
                                                        "before an opportunistic machine is taken back (default 120)")]


class ReclaimPolicy(Struct, forbid_unknown_fields=True):
    """An opportunistic entitlement's disruption budget: how much of it reclaims may take at once."""
    max_machines: Union[Annotated[int, Meta(ge=1, le=1_000_000, description="machines in reclaim at once, at most "
                                            "(default 10)")], msgspec.UnsetType] = msgspec.UNSET
    max_percent: Union[Annotated[float, Meta(ge=1, le=100, description="percent of what it holds in reclaim at "
                                             "once, at most (at least one machine; default 50)")],
                       msgspec.UnsetType] = msgspec.UNSET
    cooldown: Union[Annotated[float, Meta(ge=0, le=86_400, description="seconds after a reclaim begins before "
                                          "the next may (a failure's reclaims excepted; default 0)")],
                    msgspec.UnsetType] = msgspec.UNSET


class EntitlementPatch(Struct, forbid_unknown_fields=True):
    quota: Union[Annotated[int, Meta(ge=0, le=1_000_000)], msgspec.UnsetType] = msgspec.UNSET
    profile: Union[Name, None, msgspec.UnsetType] = msgspec.UNSET
    owner: Union[Annotated[str, Meta(max_length=MAX_OWNER)], msgspec.UnsetType] = msgspec.UNSET
    spread: Union[Spread, msgspec.UnsetType] = msgspec.UNSET
    allow_host_network: Union[bool, msgspec.UnsetType] = msgspec.UNSET
    allow_controller_networks: Union[Networks, msgspec.UnsetType] = msgspec.UNSET
    rollout: Union[RolloutPolicy, msgspec.UnsetType] = msgspec.UNSET
    notice: Union[Notice, msgspec.UnsetType] = msgspec.UNSET
    reclaim: Union[ReclaimPolicy, msgspec.UnsetType] = msgspec.UNSET


class EntitlementSpec(Struct, forbid_unknown_fields=True):
    name: Name
    machine_type: Name
    quota: Annotated[int, Meta(ge=0, le=1_000_000)]
    profile: Union[Name, None] = None
    owner: Annotated[str, Meta(max_length=MAX_OWNER)] = ""
    spread: Union[Spread, msgspec.UnsetType] = msgspec.UNSET
    allow_host_network: Annotated[bool, Meta(description="its jobs may use network_mode host (admin policy)")] = False
    allow_controller_networks: Networks = []
    rollout: Union[RolloutPolicy, msgspec.UnsetType] = msgspec.UNSET
    kind: Annotated[Literal["guaranteed", "opportunistic"], Meta(
        description="guaranteed: its machines are its own up to its quota; opportunistic: its jobs run on "
                    "machines the region does not need now and give them back, after `notice`, when a "
                    "guaranteed entitlement needs them (fixed at creation)")] = "guaranteed"
    notice: Notice = 120.0
    reclaim: Union[ReclaimPolicy, msgspec.UnsetType] = msgspec.UNSET


class EntitlementMove(Struct, forbid_unknown_fields=True):
    shard: Annotated[int, Meta(ge=0, le=1_000_000)]


class TaskTemplate(TaskBody):  # the agent's task body (agent/models.py: one definition), and secrets
    secret_env: Annotated[dict[EnvName, Union[Annotated[str, Meta(max_length=MAX_ENV_SIZE)], int, float, None]],
                          Meta(max_length=MAX_ENV, description="never shown by the API (null in its answers); "
                               "null in an update keeps the current value")] = {}


class Requirements(Struct, forbid_unknown_fields=True):
    machine_type: Union[Label, None] = None
    dc: Union[Label, None] = None


class Preference(Struct, forbid_unknown_fields=True):
    property: Level = "msb"
    strategy: Literal[STRATEGIES] = "spread"  # type: ignore[valid-type]
    weight: Annotated[float, Meta(ge=0, lt=1e300)] = 1.0


class Update(Struct, forbid_unknown_fields=True):
    max_unavailable: Annotated[int, Meta(ge=1, le=10_000)] = 1
    reprofile: Annotated[Literal["stop", "move"], Meta(description="during a profile rollout of its machines: stop "
                         "each task in place and start it after the switch, or move it to a machine not in the "
                         "batch first (make-before-break)")] = "stop"


class Metric(Struct, forbid_unknown_fields=True):
    target: Annotated[float, Meta(gt=0, lt=1e12, description="the load one task should carry")]
    prometheus: Union[Annotated[str, Meta(min_length=1, max_length=4096, description="a PromQL query whose value is "
                                          "the job's total load (controld --prometheus-url)")], None] = None
    http: Union[Annotated[str, Meta(pattern=r"^https?://", max_length=2048, description="a URL that answers the "
                                    "job's total load as a number")], None] = None


class Autoscale(Struct, forbid_unknown_fields=True):
    min: Annotated[int, Meta(ge=0, le=10_000)] = 1
    max: Annotated[int, Meta(ge=1, le=10_000)] = 10
    target_cpu: Annotated[float, Meta(gt=0, le=1, description="used / reserved CPU each task aims at")] = 0.6
    tolerance: Annotated[float, Meta(ge=0, le=0.5)] = 0.1
    predictive: bool = True
    scale_down_after: Annotated[float, Meta(ge=0, le=86_400, description="seconds")] = 300.0
    max_changes_per_hour: Annotated[int, Meta(ge=1, le=120)] = 6
    metric: Union[Metric, None] = None


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
    autoscale: Union[Autoscale, None] = None


class Resize(Struct, forbid_unknown_fields=True):
    count: Count


class RebalanceSwitch(Struct, forbid_unknown_fields=True):
    entitlement: Union[Name, None] = None  # None: every entitlement


class CapacityReserve(Struct, forbid_unknown_fields=True):
    # free machines per machine type and dc that opportunistic entitlements leave free (0: none)
    machines: Annotated[int, Meta(ge=0, le=10_000)]


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
    steady: Annotated[Union[bool, None], Meta(description="the container ran when Docker was asked 5 s or more "
                                                          "after it started (absent: the agent does not say)")] = None


class HealthReport(Struct):
    ok: bool = False
    problems: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=256)] = []


class ProfileReport(Struct):
    name: Union[Annotated[str, Meta(max_length=4096)], None] = None
    hash: Union[Annotated[str, Meta(max_length=128)], None] = None  # the content hash of the profile in force
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
    usage: Union[Usage, None] = None  # absent: not measured (an older agent, or no window yet)


class Shutdown(Struct, forbid_unknown_fields=True):
    reason: Literal["reboot"]


class RelayReport(Struct):
    tasks: Union[list[dict[str, Any]], None] = None  # the agent's report, as its heartbeat had it (checked there)
    error: Union[str, None] = ""
    at: Union[float, None] = None  # when the relaying member last knew the report current (wall clock)


Figure = Annotated[int, Meta(ge=-(1 << 62), le=1 << 62)]  # an integer sum (millicores, MiB, milliwatts, a count)


class UsagePartial(Struct, forbid_unknown_fields=True):
    """A replica's usage sums (controlplane/usage/region.py): per job [millicores, MiB, tasks],
    per fleet cell [dc, msb, entitlement, profile, machine type, then usage.region.CELL_FIGURES]."""

    jobs: dict[Label, tuple[Figure, Figure, Figure]] = {}
    cells: list[tuple[str, str, str, str, str, Figure, Figure, Figure, Figure, Figure, Figure, Figure]] = []


class Relay(Struct, forbid_unknown_fields=True, rename={"from_": "from"}):
    from_: Label
    seen: list[Label] = []
    reports: dict[Label, RelayReport] = {}
    usage: Union[UsagePartial, None] = None  # the sender's usage sums, every second or so
    behind: Union[Annotated[float, Meta(ge=0, le=86_400)], None] = None  # seconds its intake was behind (relay.py)


# query parameters, bounded here once (app.py checks them, openapi.py declares them)
MAX_VERSION = 64  # characters of a desired state's ?version
MAX_WAIT_ASKED = 3600  # seconds a long poll's ?wait may ask for (at most --max-long-poll are waited)
MAX_ROUND_MOVES = 100_000  # a rebalance round's ?max_moves
ALL = ("0", "1", "true", "false")  # a yes/no query parameter (body.query_flag)

BODIES: dict[str, type] = {t.__name__: t for t in (EntitlementSpec, EntitlementPatch, EntitlementMove, JobSpec,
                                                   Resize, RebalanceSwitch, CapacityReserve, TokenSpec, MaintenanceSpec, Relay,
                                                   AgentRegister,
                                                   Heartbeat, Shutdown)}

INT_GOT_FLOAT = re.compile(r"Expected `int( \| null)?`, got `float`")  # msgspec's words for 3.0 where an int goes


def checked(data: Any, schema: type) -> Any:
    """`data` (a decoded JSON body) as it is, if it fits `schema`; else a 400 naming the field."""
    try:
        try:
            msgspec.convert(data, schema, strict=True)
        except msgspec.ValidationError as e:
            if not INT_GOT_FLOAT.search(str(e)):
                raise
            # JSON has one number type: 3.0 is the integer 3 (as JSON Schema says); taken as it
            data = _integral(data)
            msgspec.convert(data, schema, strict=True)
    except RecursionError:
        raise ApiError("invalid", "body", "nested too deep") from None
    except msgspec.ValidationError as e:
        raise ApiError("invalid", *field_and_why(data, e)) from None
    return data


def decoded(raw: bytes, schema: type) -> Any:
    """`raw` (a JSON body) decoded into `schema`'s type in one pass; else a 400 naming the field."""
    try:
        try:
            return msgspec.json.decode(raw, type=schema, strict=True)
        except msgspec.ValidationError as e:
            if not INT_GOT_FLOAT.search(str(e)):
                raise
            # JSON has one number type: 3.0 is the integer 3 (as JSON Schema says), as checked() takes it
            return msgspec.convert(_integral(msgspec.json.decode(raw)), schema, strict=True)
    except RecursionError:
        raise ApiError("invalid", "body", "nested too deep") from None
    except msgspec.ValidationError as e:
        raise ApiError("invalid", error_path(str(e)), error_why(str(e))) from None
    except UnicodeDecodeError as e:  # JSON is UTF-8, whatever charset the request claims
        raise ApiError("invalid", "body", f"the body is not UTF-8 (JSON is): {e.reason} at byte {e.start}") from None
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


def components() -> dict[str, Any]:
    """The bodies' and the answers' JSON schemas, for the OpenAPI document's components."""
    _, defs = msgspec.json.schema_components([*BODIES.values(), *ANSWERS.values()],
                                             ref_template="#/components/schemas/{name}")
    return defs
