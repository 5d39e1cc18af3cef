"""The records the control plane keeps in etcd, their JSON codecs, and validation of what users send.

One record per key (see store/keys.py). Records are frozen: the scheduler's reconciler derives new
ones with `dataclasses.replace` and the service commits them in one guarded transaction.

The JSON codecs are msgspec's (to_builtins and convert work on these dataclasses as they are):
every commit encodes and every watch event decodes records, and dataclasses.asdict cost tens of
microseconds a record. The JSON is the same: the same keys, nested objects and values.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import msgspec

from agent.errors import InputError
from agent.models import TaskSpec
from controlplane.allocator.model import LEVELS, STRATEGIES

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$(?!\n)")  # the end of the text (agent/models.py)
MAX_OWNER = 256  # characters of an entitlement's owner
TASK_STATES = ("pending", "allocated", "starting", "running", "stopping", "stopped", "failed", "lost", "suspended")
JOB_STATES = ("active", "stopping", "stopped")
# Tasks in these states are in their machine's desired state (the agent runs them). A suspended
# task keeps its machine (and the resources it holds there) while the machine is in maintenance,
# but its container is stopped; it starts there again when the maintenance ends.
ON_MACHINE = ("starting", "running", "failed", "lost")
MAINTENANCE_POLICIES = ("move", "stop")


class ApiError(Exception):
    """A request the daemon refuses: kind maps to the HTTP status, field names what is wrong."""

    STATUS = {"invalid": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404, "timeout": 408, "exists": 409, "conflict": 409,
              "too_large": 413, "unprocessable": 422, "quota": 422, "no_placement": 422, "unavailable": 503}

    def __init__(self, kind: str, field: str | None, why: str):
        super().__init__(f"{field}: {why}" if field else why)
        self.kind, self.field, self.why = kind, field, why

    @property
    def status(self) -> int:
        return self.STATUS[self.kind]

    def to_json(self) -> dict:
        return {"error": self.kind, "field": self.field, "why": self.why}


def _encode(record: Any) -> dict:
    """A record as JSON-ready builtins: a fresh dict, nested dicts copied (as dataclasses.asdict)."""
    return msgspec.to_builtins(record)


def _decode(cls: type, d: dict, unchecked: Callable[[dict], Any] | None = None) -> Any:
    """A record from its JSON dict; keys the record does not know are ignored. A value of another
    type than its field's (a record written by an older version) is taken as it is, as before
    msgspec: by `unchecked`, or by the record's constructor."""
    try:
        return msgspec.convert(d, cls)
    except msgspec.ValidationError:
        if unchecked is not None:
            return unchecked(d)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def _check_keys(data: Any, known: set[str], where: str) -> dict:
    if not isinstance(data, dict):
        raise ApiError("invalid", where or None, "must be an object")
    for k in data:
        if k not in known:
            prefix = f"{where}." if where else ""
            raise ApiError("invalid", prefix + k, f"unknown field; known: {', '.join(sorted(known))}")
    return data


def _name(value: Any, field_: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ApiError("invalid", field_, f"{value!r} must be lower case letters, digits, '_.-' (1-63)")
    return value


def _int(value: Any, field_: str, low: int, high: int = 1_000_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError("invalid", field_, f"{value!r} must be an integer from {low} to {high}")
    return value


def _opt_str(value: Any, field_: str, longest: int = 253) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or len(value) > longest):
        shown = repr(value)
        raise ApiError("invalid", field_, f"{shown[:80] + '...' if len(shown) > 80 else shown} must be a non-empty "
                       f"string of at most {longest} characters, or null")
    return value


# -- entitlements ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    properties: tuple[str, ...] = ("dc", "msb")
    pinned_dc: str | None = None

    @classmethod
    def parse(cls, data: Any, where: str = "spread") -> Spread:
        _check_keys(data, {"properties", "pinned_dc"}, where)
        props = data.get("properties", ["dc", "msb"])
        if isinstance(props, str):
            props = [p for p in props.split(",") if p]
        if not isinstance(props, list) or not all(p in LEVELS for p in props):
            raise ApiError("invalid", f"{where}.properties", f"{props!r} must be a list of {', '.join(LEVELS)}")
        return cls(tuple(props), _opt_str(data.get("pinned_dc"), f"{where}.pinned_dc"))

    def to_json(self) -> dict:
        return {"properties": list(self.properties), "pinned_dc": self.pinned_dc}


@dataclass(frozen=True, slots=True)
class EntitlementRec:
    name: str
    machine_type: str
    quota: int
    profile: str | None = None
    owner: str = ""
    spread: Spread = Spread()
    shard: int = 0
    created_at: float = 0.0
    # admin policy: its jobs may put tasks on the host's network (which reaches all the host reaches)
    allow_host_network: bool = False

    def to_json(self) -> dict:
        d = _encode(self)
        d["spread"] = self.spread.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> EntitlementRec:
        return _decode(cls, d, lambda d: cls(**{**d, "spread": Spread(tuple(d["spread"]["properties"]),
                                                                        d["spread"]["pinned_dc"])}))

    @classmethod
    def parse(cls, data: Any, shards: int = 1) -> EntitlementRec:
        _check_keys(data, {"name", "machine_type", "quota", "profile", "owner", "spread", "allow_host_network"}, "")
        for required in ("name", "machine_type", "quota"):
            if required not in data:
                raise ApiError("invalid", required, "missing")
        name = _name(data["name"], "name")
        ent = cls(name=name, machine_type=_name(data["machine_type"], "machine_type"),
                  quota=_int(data["quota"], "quota", 0), created_at=time.time(),
                  shard=sum(name.encode()) % max(shards, 1))
        return ent.modified({k: v for k, v in data.items() if k in ("profile", "owner", "spread", "allow_host_network")})

    def modified(self, data: Any) -> EntitlementRec:
        """The entitlement with the fields of a PATCH body changed."""
        _check_keys(data, {"quota", "profile", "owner", "spread", "allow_host_network"}, "")
        changes: dict[str, Any] = {}
        if "quota" in data:
            changes["quota"] = _int(data["quota"], "quota", 0)
        if "profile" in data:
            # a profile's name, as in profiles/NAME.toml: never a path (agents look it up by name)
            changes["profile"] = None if data["profile"] is None else _name(data["profile"], "profile")
        if "owner" in data:
            if not isinstance(data["owner"], str) or len(data["owner"]) > MAX_OWNER:
                raise ApiError("invalid", "owner", f"must be a string of at most {MAX_OWNER} characters")
            changes["owner"] = data["owner"]
        if "spread" in data:
            changes["spread"] = Spread.parse(data["spread"])
        if "allow_host_network" in data:  # a boolean (the schema)
            changes["allow_host_network"] = data["allow_host_network"]
        return replace(self, **changes)


# -- jobs --------------------------------------------------------------------------------------

TASK_FIELDS = ("image", "command", "env", "secret_env", "cpus", "memory_mb", "pids", "network_mode")


MAX_JOB_BYTES = 64 * 1024 * 1024  # what a job's task records may weigh in the store together


def check_job_size(count: int, task: dict) -> None:
    """Each task's record carries the job's template: count x template is what the job puts in
    the store, bounded so that one job cannot fill it (etcd's default quota is 2 GiB)."""
    each = len(msgspec.json.encode(task)) + 512
    if count * each > MAX_JOB_BYTES:
        raise ApiError("unprocessable", "count", f"{count} tasks of a {each}-byte template would put {count * each} bytes "
                       f"in the store; at most {MAX_JOB_BYTES}: fewer tasks, or a smaller command or env")


def parse_task(data: Any, handle: str) -> dict:
    """A job's task template, validated by the agent's own TaskSpec codec (one codec for both
    ends), returned in the canonical form the agent will receive.

    `secret_env` holds environment variables whose values the API never shows (its views give
    each name with a null value); the agent that runs the task receives them in its
    environment. The same rules as `env` hold for it, and for both together."""
    _check_keys(data, set(TASK_FIELDS), "task")
    secret = data.get("secret_env", {})  # an object of names (the schema)
    plain = {k: v for k, v in data.items() if k != "secret_env"}
    ids = {"job": handle, "index": 0, "spec_version": 1}
    try:
        spec = TaskSpec.from_json({**plain, **ids}, "job", "task")
    except InputError as e:
        raise ApiError("invalid", e.field, e.why) from None
    out = {k: v for k, v in spec.to_json().items() if k in TASK_FIELDS}
    if nulls := sorted(k for k, v in secret.items() if v is None):
        raise ApiError("unprocessable", f"task.secret_env.{nulls[0]}", "null keeps a job's current value, and a new "
                       "job has none")
    if secret:
        try:
            secret = dict(TaskSpec.from_json({**plain, **ids, "env": secret}, "job", "task").env)  # as env's
        except InputError as e:
            raise ApiError("invalid", e.field.replace("task.env", "task.secret_env", 1), e.why) from None
        if both := set(secret) & set(out.get("env", {})):
            raise ApiError("unprocessable", f"task.secret_env.{min(both)}", "is in task.env too: a variable is secret or not")
        try:
            TaskSpec.from_json({**plain, **ids, "env": {**out.get("env", {}), **secret}}, "job", "task")
        except InputError as e:
            raise ApiError("unprocessable", "task.secret_env", f"with task.env: {e.why}") from None
        out["secret_env"] = dict(sorted(secret.items()))
    return out


def keep_secrets(data: Any, old: "JobRec", open_value: Callable[[str, Any], Any] = lambda var, v: v) -> Any:
    """An update's body whose task.secret_env gives null for a name: the job's current value (the
    API shows secrets as nulls, so a job read and sent back keeps them), opened by
    `open_value(name, value)` (sealed at rest: controlplane/sealing.py). The same for
    controller_token: null (or absent) keeps it while the controller's URL stays, "" removes it."""
    if isinstance(data, dict) and data.get("controller_token") is None and old.controller_token \
            and data.get("controller") == old.controller:
        data = {**data, "controller_token": old.controller_token}
    old_task = old.task
    task = data.get("task") if isinstance(data, dict) else None
    secret = task.get("secret_env") if isinstance(task, dict) else None
    if not isinstance(secret, dict) or all(v is not None for v in secret.values()):
        return data
    current = old_task.get("secret_env", {})
    filled = {}
    for k, v in secret.items():
        if v is None and k not in current:
            raise ApiError("unprocessable", f"task.secret_env.{k}", "null keeps the current value, and the job has none")
        filled[k] = open_value(k, current[k]) if v is None else v
    return {**data, "task": {**task, "secret_env": filled}}


def redact_task(task: dict) -> dict:
    """A task template as the API shows it: secret values are nulls."""
    if "secret_env" not in task:
        return task
    return {**task, "secret_env": dict.fromkeys(task["secret_env"])}


@dataclass(frozen=True, slots=True)
class Preference:
    property: str = "msb"
    strategy: str = "spread"
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class JobRec:
    entitlement: str
    name: str
    count: int
    task: dict
    spec_version: int = 1
    machine_type: str | None = None
    dc: str | None = None
    preferences: tuple[Preference, ...] | None = None
    max_unavailable: int = 1
    controller: str | None = None
    state: str = "active"
    created_at: float = 0.0
    updated_at: float = 0.0
    controller_token: str | None = None  # sent to the controller as a Bearer token; never shown by the API

    @property
    def handle(self) -> str:
        return f"{self.entitlement}/{self.name}"

    def to_json(self) -> dict:
        return {
            "handle": self.handle, "entitlement": self.entitlement, "name": self.name, "count": self.count,
            "task": self.task, "spec_version": self.spec_version,
            "requirements": {"machine_type": self.machine_type, "dc": self.dc},
            "preferences": None if self.preferences is None else [_encode(p) for p in self.preferences],
            "update": {"max_unavailable": self.max_unavailable}, "controller": self.controller,
            "controller_token": self.controller_token,
            "state": self.state, "created_at": self.created_at, "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, d: dict) -> JobRec:
        prefs = d.get("preferences")
        return cls(
            entitlement=d["entitlement"], name=d["name"], count=d["count"], task=d["task"],
            spec_version=d["spec_version"], machine_type=d["requirements"]["machine_type"],
            dc=d["requirements"]["dc"], preferences=None if prefs is None else tuple(Preference(**p) for p in prefs),
            max_unavailable=d["update"]["max_unavailable"], controller=d.get("controller"), state=d["state"],
            created_at=d.get("created_at", 0.0), updated_at=d.get("updated_at", 0.0),
            controller_token=d.get("controller_token"),
        )

    @classmethod
    def parse(cls, data: Any) -> JobRec:
        """A job spec from a user (docs/api.md). Raises ApiError naming the field."""
        _check_keys(data, {"entitlement", "name", "count", "task", "requirements", "preferences", "update",
                           "controller", "controller_token"}, "")
        for required in ("entitlement", "name", "count", "task"):
            if required not in data:
                raise ApiError("invalid", required, "missing")
        ent, name = _name(data["entitlement"], "entitlement"), _name(data["name"], "name")
        req = _check_keys(data.get("requirements") or {}, {"machine_type", "dc"}, "requirements")
        update = _check_keys(data.get("update") or {}, {"max_unavailable"}, "update")
        controller = _opt_str(data.get("controller"), "controller", 2048)
        if controller is not None and not re.match(r"^https?://", controller):
            raise ApiError("invalid", "controller", f"{controller!r} must be an http(s) URL")
        token = data.get("controller_token") or None  # "": none; printable ASCII (the schema)
        if token is not None and controller is None:
            raise ApiError("unprocessable", "controller_token", "a token for which controller? give controller too")
        now = time.time()
        count, task = _int(data["count"], "count", 0, 10_000), parse_task(data["task"], f"{ent}/{name}")
        check_job_size(count, task)
        return cls(
            entitlement=ent, name=name, count=count, task=task,
            machine_type=_opt_str(req.get("machine_type"), "requirements.machine_type"),
            dc=_opt_str(req.get("dc"), "requirements.dc"), preferences=_preferences(data.get("preferences")),
            max_unavailable=_int(update.get("max_unavailable", 1), "update.max_unavailable", 1, 10_000),
            controller=controller, controller_token=token, created_at=now, updated_at=now,
        )

    def resources(self) -> tuple[float, int]:
        return float(self.task["cpus"]), int(self.task["memory_mb"])


def _preferences(data: Any) -> tuple[Preference, ...] | None:
    if data is None:
        return None
    if not isinstance(data, list):
        raise ApiError("invalid", "preferences", "must be a list of {property, strategy, weight}")
    out = []
    for i, p in enumerate(data):
        where = f"preferences[{i}]"
        _check_keys(p, {"property", "strategy", "weight"}, where)
        prop, strategy = p.get("property", "msb"), p.get("strategy", "spread")
        weight = p.get("weight", 1.0)
        if prop not in LEVELS:
            raise ApiError("invalid", f"{where}.property", f"{prop!r} is not one of {', '.join(LEVELS)}")
        if strategy not in STRATEGIES:
            raise ApiError("invalid", f"{where}.strategy", f"{strategy!r} is not one of {', '.join(STRATEGIES)}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
            raise ApiError("invalid", f"{where}.weight", f"{weight!r} must be a number >= 0")
        out.append(Preference(prop, strategy, float(weight)))
    return tuple(out)


# -- tasks, machines, events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskRec:
    job: str
    index: int
    spec_version: int
    spec: dict  # the job's task template at spec_version
    machine: str | None = None
    state: str = "pending"
    reason: str = ""
    discovery: bool = False
    since: float = 0.0

    @property
    def resources(self) -> tuple[float, int]:
        return float(self.spec["cpus"]), int(self.spec["memory_mb"])

    def to_json(self) -> dict:
        return _encode(self)

    @classmethod
    def from_json(cls, d: dict) -> TaskRec:
        return _decode(cls, d)

    def moved(self, **changes: Any) -> TaskRec:
        """The task with changes; `since` is reset when the state changes."""
        new = replace(self, **changes)
        if new.state != self.state:
            new = replace(new, since=time.time())
        return new

    def agent_spec(self, open_secrets: Callable[[str, dict], dict] | None = None) -> dict:
        """The task as its agent runs it: secret_env joins the environment (the agent alone is
        told), opened by `open_secrets(job, template)` (Sealer.open_task: sealed at rest)."""
        spec = self.spec
        if "secret_env" in spec:
            secret = (open_secrets(self.job, spec) if open_secrets else spec)["secret_env"]
            spec = {k: v for k, v in spec.items() if k != "secret_env"}
            spec["env"] = dict(sorted({**spec.get("env", {}), **secret}.items()))
        return {"job": self.job, "index": self.index, "spec_version": self.spec_version, **spec}


@dataclass(frozen=True, slots=True)
class MachineRec:
    id: str
    hostname: str
    labels: dict
    capacity: dict
    entitlement: str | None = None
    healthy: bool = True
    health_reason: str = ""
    profile_applied: str | None = None
    profile_ok: bool = True
    profile_error: str = ""
    alloc_tasks: int = 0
    alloc_cpus: float = 0.0
    alloc_memory_mb: int = 0
    address: str = ""
    agent_version: str = ""
    credential_sha256: str = ""
    registered_at: float = 0.0
    # Tasks moved off (or stopped on) this machine while it was unhealthy, whose containers may
    # still run there: (job, index, cpus, memory_mb, when it was made: wall-clock seconds) each.
    # Their resources stay allocated, and the machine stays unhealthy and in its entitlement, until
    # its agent reports them gone (tombstones.py).
    tombstones: tuple[tuple[str, int, float, int, float], ...] = ()

    def to_json(self) -> dict:
        return _encode(self)

    @classmethod
    def from_json(cls, d: dict) -> MachineRec:
        stones = d.get("tombstones")
        if stones and any(len(t) == 4 for t in stones):
            # written before tombstones carried when they were made: made at 0, so that any report
            # the daemon holds speaks for them (as it did then)
            d = {**d, "tombstones": [[*t, 0.0] if len(t) == 4 else t for t in stones]}
        return _decode(cls, d)


def back_to_pool(m: dict) -> str | None:
    """A machine record (JSON) that holds nothing more, no task and no tombstone, leaves its
    entitlement for the free pool (paper Figure 7): its allocation zeroed in place; returns the
    entitlement it left (None: it stays). The scheduler's transactions and the health check's
    tombstone drops both end so; each writes that entitlement's record too."""
    if m.get("alloc_tasks", 0) > 0 or m.get("tombstones") or m.get("entitlement") is None:
        return None
    left = m["entitlement"]
    m.update(entitlement=None, alloc_tasks=0, alloc_cpus=0.0, alloc_memory_mb=0)
    return left


@dataclass(frozen=True, slots=True)
class EventRec:
    """An unavailability event. A failure is opened by the health check and ended when the machine
    answers again. A maintenance is scheduled by an operator: its machines take no new tasks from
    then on; jobs hear of it in advance notices; at `deadline` the tasks still on the machines are
    stopped; the machines are back at `start + duration` (or at `end`, if an operator ended it)."""

    id: str
    kind: str  # failure | maintenance
    machines: tuple[str, ...]
    start: float
    reason: str = ""
    duration: float | None = None
    deadline: float | None = None
    end: float | None = None
    scope: str = ""  # maintenance: what the operator selected ("msb dc1/msb1", "3 machines")
    policy: str | None = None  # maintenance: for jobs without a TaskController; None: the region default
    created: float = 0.0

    @property
    def due(self) -> float:
        """When the tasks must be off the machines: the deadline, else the start."""
        return self.deadline if self.deadline is not None else self.start

    @property
    def until(self) -> float:
        """When the machines are back: the end an operator set, else start + duration."""
        if self.end is not None:
            return self.end
        return self.start + (self.duration or 0.0) if self.kind == "maintenance" else float("inf")

    def phase(self, now: float) -> str:
        """A maintenance's phase: scheduled (before its deadline), in progress (its machines may
        run nothing), or over."""
        if now >= self.until:
            return "over"
        return "scheduled" if now < self.due else "in progress"

    def to_json(self) -> dict:
        d = _encode(self)
        d["machines"] = list(self.machines)
        return d

    @classmethod
    def from_json(cls, d: dict) -> EventRec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known and k != "machines"}, machines=tuple(d["machines"]))


MAINTENANCE_FIELDS = {"machines", "dc", "msb", "rack", "start", "duration", "deadline", "policy", "reason"}
MAX_MAINTENANCE = 30 * 86400.0  # seconds: a window longer than a month is a typo
MAX_AHEAD = 366 * 86400.0  # seconds: maintenance is scheduled at most a year ahead


def _time(value: Any, field_: str, now: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ApiError("invalid", field_, f"{value!r} must be a time in seconds since the epoch")
    if value > now + MAX_AHEAD:
        raise ApiError("unprocessable", field_, f"{value!r} is more than a year ahead (seconds since the epoch, "
                       "not milliseconds?)")
    return float(value)


def parse_maintenance(data: Any, machines: dict[str, MachineRec], now: float) -> EventRec:
    """A maintenance the operator asks for: the machines (listed, or every machine in a dc, msb or
    rack, the labels ANDed), a start, a duration, and a deadline at or before the start (default:
    the start). Names the field at fault; writes nothing."""
    d = _check_keys(data, MAINTENANCE_FIELDS, "")
    listed = d.get("machines")
    labels = {k: d[k] for k in ("dc", "msb", "rack") if d.get(k) is not None}
    for k, v in labels.items():
        if not isinstance(v, str) or not v:
            raise ApiError("invalid", k, f"{v!r} must be a non-empty string")
    if listed is None and not labels:
        raise ApiError("unprocessable", "machines", "name the machines: a list of machine ids, or dc, msb or rack")
    if listed is not None:
        if not isinstance(listed, list) or not listed or not all(isinstance(m, str) for m in listed):
            raise ApiError("invalid", "machines", "must be a non-empty list of machine ids")
        unknown = [m for m in listed if m not in machines]
        if unknown:
            raise ApiError("unprocessable", "machines", f"no such machine(s): {', '.join(unknown[:5])}")
    chosen = sorted(mid for mid, m in machines.items() if (listed is None or mid in listed)
                    and all(m.labels.get(k) == v for k, v in labels.items()))
    if not chosen:
        what = ", ".join(f"{k}={v}" for k, v in labels.items())
        raise ApiError("unprocessable", next(iter(labels)) if labels else "machines", f"no machine matches {what}")
    start = _time(d.get("start"), "start", now)
    duration = d.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 < duration <= MAX_MAINTENANCE:
        raise ApiError("invalid", "duration", f"{duration!r} must be seconds, more than 0 and at most {MAX_MAINTENANCE:.0f}")
    deadline = start if d.get("deadline") is None else _time(d["deadline"], "deadline", now)
    if deadline > start:
        raise ApiError("unprocessable", "deadline", "must be at or before the start: tasks leave before the work begins")
    if start + duration <= now:
        raise ApiError("unprocessable", "start", "the maintenance would be over already")
    policy = d.get("policy")
    if policy is not None and policy not in MAINTENANCE_POLICIES:
        raise ApiError("invalid", "policy", f"{policy!r} is not one of {', '.join(MAINTENANCE_POLICIES)}")
    reason = d.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500:
        raise ApiError("invalid", "reason", "must be a string of at most 500 characters")
    if labels:
        scope = " ".join(f"{k}={v}" for k, v in labels.items())
    else:
        scope = ", ".join(chosen) if len(chosen) <= 3 else f"{len(chosen)} machines"
    eid = f"maint-{int(now)}-{secrets.token_hex(3)}"
    return EventRec(eid, "maintenance", tuple(chosen), start, reason, float(duration), deadline, None,
                    scope, policy, now)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A discovery record: where a task answers, and whether clients should send it traffic."""

    job: str
    index: int
    machine: str
    address: str
    enabled: bool
    spec_version: int = 0

    def to_json(self) -> dict:
        return _encode(self)
