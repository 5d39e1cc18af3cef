"""The records the control plane keeps in etcd, their JSON codecs, and what users send made into them.

A body's shape (fields, types, bounds, patterns) is checked once, against its schema
(controlplane/frontend/schema.py, which the OpenAPI document is generated from) before it gets here;
the parsers here check what a schema cannot say: one field against another, against the region as
it is, and a task template by the agent's own codec.

One record per key (see store/keys.py). Records are frozen: the scheduler's reconciler derives new
ones with `dataclasses.replace` and the service commits them in one guarded transaction.

The JSON codecs are msgspec's (to_builtins and convert work on these dataclasses as they are):
every commit encodes and every watch event decodes records, and dataclasses.asdict cost tens of
microseconds a record. The JSON is the same: the same keys, nested objects and values.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import msgspec

from agent.errors import InputError
from agent.models import TaskSpec
from controlplane.store.autoscale import Autoscale
from controlplane.store.digest import NO_DIGEST, Digest, dec_hook, enc_hook
from controlplane.store.errors import ApiError

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$(?!\n)")  # the end of the text (agent/models.py)
MAX_OWNER = 256  # characters of an entitlement's owner
TASK_STATES = ("pending", "allocated", "starting", "running", "stopping", "stopped", "failed", "lost", "suspended")
JOB_STATES = ("active", "stopping", "stopped")
# Tasks in these states are in their machine's desired state (the agent runs them). A suspended
# task keeps its machine (and the resources it holds there) while the machine is in maintenance,
# but its container is stopped; it starts there again when the maintenance ends.
ON_MACHINE = ("starting", "running", "failed", "lost")


def _encode(record: Any) -> dict:
    """A record as JSON-ready builtins: a fresh dict, nested dicts copied (as dataclasses.asdict)."""
    return msgspec.to_builtins(record, enc_hook=enc_hook)


def _decode(cls: type, d: dict, unchecked: Callable[[dict], Any] | None = None) -> Any:
    """A record from its JSON dict; keys the record does not know are ignored. A value of another
    type than its field's (a record written by an older version) is taken as it is, as before
    msgspec: by `unchecked`, or by the record's constructor."""
    try:
        return msgspec.convert(d, cls, dec_hook=dec_hook)
    except msgspec.ValidationError:
        if unchecked is not None:
            return unchecked(d)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# -- entitlements ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    properties: tuple[str, ...] = ("dc", "msb")
    pinned_dc: str | None = None

    @classmethod
    def parse(cls, data: dict) -> Spread:
        """From a body's spread (schema.Spread)."""
        return cls(tuple(data.get("properties", ("dc", "msb"))), data.get("pinned_dc"))

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
    # admin policy: networks (CIDR) its jobs' TaskControllers may be at although controld refuses
    # them otherwise: loopback, link-local, the control plane's own (taskcontrol/reach.py)
    allow_controller_networks: tuple[str, ...] = ()
    # how a change of its host profile rolls out (controlplane/rollouts): {max_unavailable,
    # auto_rollback, deadline}, each absent one the default
    rollout: dict | None = None
    # guaranteed (the default) or opportunistic: its jobs run on machines the region does not need
    # now and give them back when a guaranteed entitlement needs them, after `notice` seconds of
    # advance notice to their TaskControllers (docs/api.md, "Opportunistic capacity")
    kind: str = "guaranteed"
    notice: float = 120.0
    # an opportunistic entitlement's disruption budget ({max_machines, max_percent, cooldown}, each
    # absent one the region's default: capacity/reclaim.py Budget)
    reclaim: dict | None = None

    def to_json(self) -> dict:
        d = _encode(self)
        d["spread"] = self.spread.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> EntitlementRec:
        return _decode(cls, d, lambda d: cls(**{**d, "spread": Spread(tuple(d["spread"]["properties"]),
                                                                        d["spread"]["pinned_dc"])}))

    @classmethod
    def parse(cls, data: dict, shards: int = 1) -> EntitlementRec:
        """From a POST body (schema.EntitlementSpec)."""
        name = data["name"]
        ent = cls(name=name, machine_type=data["machine_type"], quota=data["quota"], created_at=time.time(),
                  shard=sum(name.encode()) % max(shards, 1))
        ent = replace(ent, kind=data.get("kind", ent.kind))  # fixed at creation: no change takes it
        return ent.modified({k: v for k, v in data.items() if k in
                             ("profile", "owner", "spread", "allow_host_network", "allow_controller_networks", "rollout",
                              "notice", "reclaim")})

    def modified(self, data: dict) -> EntitlementRec:
        """The entitlement with the fields of a PATCH body (schema.EntitlementPatch) changed. A
        profile is a name, as in profiles/NAME.toml, never a path (the schema's pattern)."""
        changes = {k: v for k, v in data.items() if k in ("quota", "profile", "owner", "allow_host_network", "notice")}
        if "spread" in data:
            changes["spread"] = Spread.parse(data["spread"])
        if "allow_controller_networks" in data:
            changes["allow_controller_networks"] = controller_networks(data["allow_controller_networks"])
        if "rollout" in data:  # the fields given change, the others stay
            changes["rollout"] = {**(self.rollout or {}), **data["rollout"]}
        if "reclaim" in data:  # the same
            changes["reclaim"] = {**(self.reclaim or {}), **data["reclaim"]}
        return replace(self, **changes)


def controller_networks(texts: list[str]) -> tuple[str, ...]:
    """An entitlement's allow_controller_networks as CIDR texts (normalised: 10.1.2.3/16 is
    10.1.0.0/16), each checked; ApiError names the one that is not a network."""
    out = []
    for i, text in enumerate(texts):
        try:
            out.append(str(ipaddress.ip_network(text, strict=False)))
        except ValueError as e:
            raise ApiError("unprocessable", f"allow_controller_networks[{i}]", f"{text!r} is not a network "
                           f"(CIDR, e.g. 10.20.0.0/16): {e}") from None
    return tuple(dict.fromkeys(out))


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
    """A job's task template (its shape checked: schema.TaskTemplate), made by the agent's own
    TaskSpec codec (one codec for both ends) into the canonical form the agent will receive.

    `secret_env` holds environment variables whose values the API never shows (its views give
    each name with a null value); the agent that runs the task receives them in its
    environment. The same rules as `env` hold for it, and for both together."""
    secret = data.get("secret_env", {})
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
    reprofile: str = "stop"  # its tasks during a profile rollout: stopped in place, or moved (make-before-break)
    controller: str | None = None
    state: str = "active"
    created_at: float = 0.0
    updated_at: float = 0.0
    # sent to the controller as a Bearer token; never shown by the API; sealed at rest (sealing.py)
    controller_token: str | None = None
    autoscale: Autoscale | None = None
    # Indices below count + len(gaps) that have no task: a scale-in that chose which tasks to stop
    # (the SRM empties whole machines) leaves them; a scale-out fills them first, lowest first.
    gaps: tuple[int, ...] = ()

    @property
    def handle(self) -> str:
        return f"{self.entitlement}/{self.name}"

    @property
    def top(self) -> int:
        """One past the highest index of the job's tasks."""
        return self.count + len(self.gaps)

    def live(self, index: int) -> bool:
        """Whether task `index` is one of the job's tasks (not beyond its count, not a gap)."""
        return 0 <= index < self.count + len(self.gaps) and not (self.gaps and index in self.gaps)

    def indices(self) -> range | tuple[int, ...]:
        """The job's task indices, in order."""
        if not self.gaps:
            return range(self.count)
        gaps = set(self.gaps)
        return tuple(i for i in range(self.top) if i not in gaps)

    def live_set(self) -> range | frozenset[int]:
        """The job's task indices, for `in`."""
        return range(self.count) if not self.gaps else frozenset(self.indices())

    def resized(self, count: int) -> JobRec:
        """The job at `count` tasks: growing fills the gaps first (lowest first), then adds at the
        top; shrinking removes the highest indices."""
        if count >= self.count:
            fill = min(count - self.count, len(self.gaps))
            return replace(self, count=count, gaps=self.gaps[fill:])
        return self.keeping(self.indices()[:count])

    def without(self, indices) -> JobRec:
        """The job with tasks `indices` removed (the SRM's choice of what to stop)."""
        drop = set(indices)
        return self.keeping([i for i in self.indices() if i not in drop])

    def keeping(self, keep) -> JobRec:
        keep = sorted(keep)
        top = keep[-1] + 1 if keep else 0
        kept = set(keep)
        return replace(self, count=len(keep), gaps=tuple(i for i in range(top) if i not in kept))

    def to_json(self) -> dict:
        return {
            "handle": self.handle, "entitlement": self.entitlement, "name": self.name, "count": self.count,
            "task": self.task, "spec_version": self.spec_version,
            "requirements": {"machine_type": self.machine_type, "dc": self.dc},
            "preferences": None if self.preferences is None else [_encode(p) for p in self.preferences],
            "update": {"max_unavailable": self.max_unavailable, "reprofile": self.reprofile},
            "controller": self.controller,
            "controller_token": self.controller_token,
            "state": self.state, "created_at": self.created_at, "updated_at": self.updated_at,
            "autoscale": None if self.autoscale is None else self.autoscale.to_json(), "gaps": list(self.gaps),
        }

    @classmethod
    def from_json(cls, d: dict) -> JobRec:
        prefs = d.get("preferences")
        return cls(
            entitlement=d["entitlement"], name=d["name"], count=d["count"], task=d["task"],
            spec_version=d["spec_version"], machine_type=d["requirements"]["machine_type"],
            dc=d["requirements"]["dc"], preferences=None if prefs is None else tuple(Preference(**p) for p in prefs),
            max_unavailable=d["update"]["max_unavailable"], reprofile=d["update"].get("reprofile", "stop"),
            controller=d.get("controller"), state=d["state"],
            created_at=d.get("created_at", 0.0), updated_at=d.get("updated_at", 0.0),
            controller_token=d.get("controller_token"), autoscale=Autoscale.from_json(d.get("autoscale")),
            gaps=tuple(d.get("gaps") or ()),
        )

    @classmethod
    def parse(cls, data: dict) -> JobRec:
        """A job spec from a user (docs/api.md), its shape checked (schema.JobSpec). Raises
        ApiError naming the field."""
        ent, name, count = data["entitlement"], data["name"], data["count"]
        req, update = data.get("requirements") or {}, data.get("update") or {}
        controller = data.get("controller")
        token = data.get("controller_token") or None  # "": none
        if token is not None and controller is None:
            raise ApiError("unprocessable", "controller_token", "a token for which controller? give controller too")
        now = time.time()
        task = parse_task(data["task"], f"{ent}/{name}")
        check_job_size(count, task)
        prefs = data.get("preferences")
        autoscale = data.get("autoscale")
        return cls(
            entitlement=ent, name=name, count=count, task=task, machine_type=req.get("machine_type"), dc=req.get("dc"),
            preferences=None if prefs is None else tuple(Preference(**{**p, "weight": float(p.get("weight", 1.0))})
                                                         for p in prefs),
            max_unavailable=update.get("max_unavailable", 1), reprofile=update.get("reprofile", "stop"),
            controller=controller, controller_token=token,
            created_at=now, updated_at=now, autoscale=None if autoscale is None else Autoscale.parse(autoscale),
        )

    def resources(self) -> tuple[float, int]:
        return float(self.task["cpus"]), int(self.task["memory_mb"])


# -- tasks, machines, events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Moving:
    """A running task's copy starting on another machine (a ReBalancer move, make-before-break):
    it holds resources there too until the copy runs and the task is switched over, or the move
    is given up."""

    machine: str
    goal: str = ""
    why: str = ""
    since: float = 0.0


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
    moving: Moving | None = None

    @property
    def resources(self) -> tuple[float, int]:
        return float(self.spec["cpus"]), int(self.spec["memory_mb"])

    def holds(self) -> tuple[str, ...]:
        """The machines whose resources the task holds: its own, and its moving copy's."""
        if self.moving is not None:
            return (self.machine, self.moving.machine) if self.machine else (self.moving.machine,)
        return (self.machine,) if self.machine else ()

    def to_json(self) -> dict:
        return _encode(self)

    @classmethod
    def from_json(cls, d: dict) -> TaskRec:
        return _decode(cls, d)

    def moved(self, **changes: Any) -> TaskRec:
        """The task with changes; `since` is reset when the state changes. A move in progress
        is given up (its copy stopped) by any change but one that keeps the task running where it
        is at its version, unless the change says otherwise. No change: the task itself."""
        if (self.moving is None or self.state == "running") and all(getattr(self, k) == v for k, v in changes.items()):
            return self  # (each scheduler pass asks it of every task of the job)
        new = replace(self, **changes)
        if new.state != self.state:
            new = replace(new, since=time.time())
        if new.moving is not None and "moving" not in changes and (
                new.state != "running" or new.machine != self.machine or new.spec_version != self.spec_version):
            new = replace(new, moving=None)
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
    profile_hash: str | None = None  # the content hash of what its agent applied (None: an agent that does not say)
    profile_ok: bool = True
    profile_error: str = ""
    # (what its tasks hold is not written here: RegionState.allocated() sums it from the tasks, so
    # that a placement writes its tasks and guards its machines' records without rewriting them;
    # the alloc_tasks, alloc_cpus and alloc_memory_mb an older version wrote are ignored)
    address: str = ""
    agent_version: str = ""
    credential_sha256: Digest = NO_DIGEST  # of its credential (NO_DIGEST: released, or none yet)
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
        rec = _decode(cls, d)
        if not isinstance(rec.credential_sha256, Digest):  # (a record of an older shape: its constructor's)
            object.__setattr__(rec, "credential_sha256", Digest.parse(rec.credential_sha256 or b""))
        return rec


@dataclass(frozen=True, slots=True)
class EventRec:
    """An unavailability event. A failure is opened by the health check and ended when the machine
    answers again. A maintenance is scheduled by an operator: its machines take no new tasks from
    then on; jobs hear of it in advance notices; at `deadline` the tasks still on the machines are
    stopped; the machines are back at `start + duration` (or at `end`, if an operator ended it)."""

    id: str
    kind: str  # failure | maintenance | controller (a TaskController not called at a refused address) | reclaim
    machines: tuple[str, ...]
    start: float
    reason: str = ""
    duration: float | None = None
    deadline: float | None = None
    end: float | None = None
    scope: str = ""  # maintenance: what the operator selected ("msb dc1/msb1", "3 machines"); controller: the job
    policy: str | None = None  # maintenance: for jobs without a TaskController; None: the region default
    created: float = 0.0
    # reclaim (controlplane/capacity): opportunistic machines of the entitlement `scope` taken back
    # for the guaranteed entitlement `heir`, why (`cause`: demand, forecast, failure); its tasks
    # leave by `deadline`, and each machine goes to the heir as it empties. Over (`end`) once none
    # of its machines is the opportunistic entitlement's any more.
    heir: str | None = None
    cause: str = ""

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
