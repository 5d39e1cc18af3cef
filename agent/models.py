"""Wire models shared by the agent and the control plane: task specs and the desired state.

The desired state is what a source (a local file now, the control plane later) asks of one host:
a host profile and the tasks to run. One codec: `from_json` / `to_json` on plain dicts.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from agent.decoding import field_and_why, value_at
from agent.errors import DesiredStateError

_HANDLE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}/[a-z0-9][a-z0-9_.-]{0,62}$(?!\n)")
# "$(?!\n)": the end of the text in Python (whose "$" also matches before a last newline) and in
# the OpenAPI document's ECMA regexes alike, so the API's schema, made from these, agrees
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$(?!\n)")
# A task's size, so that a job record (and each of its tasks' records) stays far below what the
# store carries in one value (etcd's request limit: 1.5 MiB by default): 64 KiB of command and
# 64 KiB of environment at most.
MAX_ARGS, MAX_COMMAND = 1024, 65536
MAX_ENV, MAX_ENV_SIZE = 1024, 65536
NETWORK_MODES = ("bridge", "none", "host")
# A task's other bounds, here once: the API's schema (controlplane/frontend/schema.py) is made from them.
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$(?!\n)")  # [registry/]name[:tag][@digest]
MAX_CPUS = 1024
MEMORY_MB = (4, 4_194_304)  # MiB, from and to
PIDS = (1, 4_194_304)


Handle = Annotated[str, Meta(pattern=_HANDLE.pattern, description="a job handle <entitlement>/<name>")]
EnvName = Annotated[str, Meta(pattern=_ENV.pattern)]
EnvValue = Union[Annotated[str, Meta(max_length=MAX_ENV_SIZE)], int, float]
Env = Annotated[dict[EnvName, EnvValue], Meta(max_length=MAX_ENV, description=f"at most {MAX_ENV} variables "
                                              f"of {MAX_ENV_SIZE} characters in all")]


MAX_HOST_CPUS = 16384  # a host's CPUs, at most, in a usage report
MAX_HOST_MEMORY_MB = (1 << 32) - 1  # MiB (4 PiB): a figure fits 32 bits (the usage book packs them so)


class TaskUsage(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """One task's usage in a heartbeat, as an array: [job, index, cpu cores, memory MiB]."""

    # bounded, not matched against a handle's pattern (20 tasks' regexes were most of a heartbeat's
    # checking): controld counts only the tasks of jobs its region has, looked up by this string
    job: Annotated[str, Meta(min_length=1, max_length=127, description="the task's job handle")]
    index: Annotated[int, Meta(ge=0, le=1_000_000)]
    cpu: Annotated[float, Meta(ge=0, le=MAX_HOST_CPUS, description="cores used over the window")]
    memory_mb: Annotated[float, Meta(ge=0, le=MAX_HOST_MEMORY_MB, description="working set, MiB")]


class Usage(msgspec.Struct, forbid_unknown_fields=True):
    """What a host and its tasks used over the window before a heartbeat (agent/usage.py)."""

    window: Annotated[float, Meta(gt=0, le=3600, description="seconds the CPU figures are averaged over")]
    cpus: Annotated[int, Meta(ge=1, le=MAX_HOST_CPUS, description="the host's CPUs")]
    cpu: Annotated[float, Meta(ge=0, le=MAX_HOST_CPUS, description="the host's cores in use")]
    memory_mb: Annotated[float, Meta(ge=0, le=MAX_HOST_MEMORY_MB, description="the host's memory in use, MiB")]
    memory_total_mb: Annotated[float, Meta(gt=0, le=MAX_HOST_MEMORY_MB)]
    power_w: Union[Annotated[float, Meta(ge=0, le=1_000_000)], None] = None  # None: not measured (no RAPL)
    tasks: Annotated[list[TaskUsage], Meta(max_length=100_000)] = []


def usage_beyond(usage: dict) -> tuple[str, str] | None:
    """(field, why) of a figure of a usage report (as decoded, checked against Usage) larger than
    the host it describes, else None."""
    cpus, total = usage["cpus"], usage["memory_total_mb"]
    slack = cpus * 1.05 + 0.05  # the two reads that make a window are not quite at once
    if usage["cpu"] > slack:
        return "usage.cpu", f"{usage['cpu']} cores in use on a host of {cpus}"
    if usage["memory_mb"] > total:
        return "usage.memory_mb", f"{usage['memory_mb']} MiB in use of the host's {total}"
    for i, (_, _, cpu, memory) in enumerate(usage.get("tasks") or ()):
        if cpu > slack:
            return f"usage.tasks[{i}]", f"{cpu} cores used on a host of {cpus}"
        if memory > total:
            return f"usage.tasks[{i}]", f"{memory} MiB used of the host's {total}"
    return None


class TaskBody(msgspec.Struct, forbid_unknown_fields=True):
    """What a task runs and what it may use, declared once: the API's schema takes a job's task
    template as this (with secret_env: controlplane/frontend/schema.py's TaskTemplate), and the
    agent reads each task of its desired state as this (with its job, index and version: TaskWire).
    What a schema cannot say (the command's and the environment's sizes in all) TaskSpec.from_json
    checks after."""

    image: Annotated[str, Meta(pattern=IMAGE.pattern, description="an image reference: [registry/]name[:tag][@digest]")]
    command: Union[Annotated[list[Annotated[str, Meta(max_length=MAX_COMMAND)]], Meta(max_length=MAX_ARGS)],
                   Annotated[str, Meta(max_length=MAX_COMMAND)]] = []
    env: Env = {}
    cpus: Annotated[float, Meta(gt=0, le=MAX_CPUS)] = 0.5
    memory_mb: Annotated[int, Meta(ge=MEMORY_MB[0], le=MEMORY_MB[1], description="MiB")] = 128
    pids: Annotated[int, Meta(ge=PIDS[0], le=PIDS[1])] = 256
    network_mode: Annotated[Literal[NETWORK_MODES],  # type: ignore[valid-type]
                            Meta(description="host: only in an entitlement with allow_host_network")] = "bridge"


class TaskWire(TaskBody, kw_only=True):
    """A task as the agent's desired state carries it."""

    job: Handle
    index: Annotated[int, Meta(ge=0, lt=1_000_000)]
    spec_version: Annotated[int, Meta(ge=0)] = 1


@dataclass(frozen=True)
class TaskKey:
    job: str  # handle: <entitlement>/<name>
    index: int

    def __str__(self) -> str:
        return f"{self.job}#{self.index}"


@dataclass(frozen=True)
class TaskSpec:
    job: str
    index: int
    spec_version: int
    image: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cpus: float = 0.5
    memory_mb: int = 128
    pids: int = 256
    network_mode: str = "bridge"

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.job, self.index)

    def spec_hash(self) -> str:
        """Changes whenever anything that shapes the container changes (not the index)."""
        body = {k: v for k, v in asdict(self).items() if k not in ("job", "index")}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        d = asdict(self)
        d["command"] = list(self.command)
        d["env"] = dict(self.env)
        return d

    @classmethod
    def from_json(cls, d: Any, where: str, field_: str) -> "TaskSpec":
        """A task of a desired state (decoded as TaskWire), its command and environment bounded in
        all; DesiredStateError names the field (`tasks[0].memory_mb`) and the value."""
        if not isinstance(d, dict):
            raise DesiredStateError(where, field_, d, "a task must be a table")
        try:
            w = msgspec.convert(d, TaskWire, strict=True)
        except msgspec.ValidationError as e:
            path, why = field_and_why(d, e)
            raise DesiredStateError(where, f"{field_}.{path}" if path else field_, value_at(d, path), why) from None
        command = ["sh", "-c", w.command] if isinstance(w.command, str) else w.command
        if len(command) > MAX_ARGS or sum(len(c) for c in command) > MAX_COMMAND:
            raise DesiredStateError(where, f"{field_}.command", f"{len(command)} arguments", f"at most {MAX_ARGS} "
                                    f"arguments of {MAX_COMMAND} characters in all")
        if sum(len(k) + len(str(v)) for k, v in w.env.items()) > MAX_ENV_SIZE:
            raise DesiredStateError(where, f"{field_}.env", f"{len(w.env)} variables", f"at most {MAX_ENV} variables "
                                    f"of {MAX_ENV_SIZE} characters in all")
        return cls(job=w.job, index=w.index, spec_version=w.spec_version, image=w.image, command=tuple(command),
                   env=tuple(sorted((k, str(v)) for k, v in w.env.items())), cpus=float(w.cpus),
                   memory_mb=w.memory_mb, pids=w.pids, network_mode=w.network_mode)


def profile_hash(sections: dict) -> str:
    """The content hash of a merged profile: sha256 of its sections as canonical JSON."""
    return hashlib.sha256(json.dumps(sections, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class ProfileSpec:
    """A merged host profile as the control plane sends it: the host applies these sections, not
    whatever file of that name it may hold, so profiles are edited in one place."""

    name: str
    hash: str
    sections: dict

    def to_json(self) -> dict:
        return {"name": self.name, "hash": self.hash, "sections": self.sections}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "ProfileSpec":
        if not isinstance(data, dict) or set(data) != {"name", "hash", "sections"}:
            raise DesiredStateError(where, "profile_spec", data, "must be a table of name, hash and sections")
        name, digest, sections = data["name"], data["hash"], data["sections"]
        if not isinstance(name, str) or not name:
            raise DesiredStateError(where, "profile_spec.name", name, "must be a profile name")
        if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
            raise DesiredStateError(where, "profile_spec.sections", sections, "must be a table of tables")
        if digest != profile_hash(sections):
            raise DesiredStateError(where, "profile_spec.hash", digest, "does not match the sections' content")
        return cls(name, digest, sections)


@dataclass(frozen=True)
class DesiredState:
    """What one host should be: a profile (None: no profile, originals restored) and its tasks.
    `profile` names the profile; with `profile_spec` (from the control plane) its merged settings
    come along, otherwise the name is looked up in the host's profile directories."""

    profile: str | None = None
    tasks: tuple[TaskSpec, ...] = ()
    version: str = ""  # opaque, from the source: a file's hash, a control-plane revision
    source: str = ""
    profile_spec: ProfileSpec | None = None

    def to_json(self) -> dict:
        out = {"profile": self.profile, "tasks": [t.to_json() for t in self.tasks], "version": self.version}
        if self.profile_spec is not None:
            out["profile_spec"] = self.profile_spec.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any, where: str, version: str = "") -> "DesiredState":
        if not isinstance(data, dict):
            raise DesiredStateError(where, "(top level)", type(data).__name__, "must be a table")
        for k in data:
            if k not in ("profile", "profile_spec", "tasks", "version"):
                raise DesiredStateError(where, k, data[k], "unknown field; known: profile, profile_spec, tasks")
        profile = data.get("profile") or None
        if profile is not None and not isinstance(profile, str):
            raise DesiredStateError(where, "profile", profile, "must be a profile name or file")
        spec = ProfileSpec.from_json(data["profile_spec"], where) if data.get("profile_spec") is not None else None
        if spec is not None and spec.name != profile:
            raise DesiredStateError(where, "profile_spec.name", spec.name, f"must be the profile's name, {profile!r}")
        raw_tasks = data.get("tasks", [])
        if not isinstance(raw_tasks, list):
            raise DesiredStateError(where, "tasks", raw_tasks, "must be a list of tables ([[tasks]])")
        tasks = tuple(TaskSpec.from_json(t, where, f"tasks[{i}]") for i, t in enumerate(raw_tasks))
        seen: dict[TaskKey, int] = {}
        for i, t in enumerate(tasks):
            if t.key in seen:
                raise DesiredStateError(where, f"tasks[{i}]", str(t.key), f"same job and index as tasks[{seen[t.key]}]")
            seen[t.key] = i
        return cls(profile, tasks, version or data.get("version", ""), where, spec)


def read_desired_file(path: Path) -> DesiredState:
    """Parse a desired-state file (TOML, or JSON by its .json suffix). Raises DesiredStateError."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DesiredStateError(str(path), "file", str(path), e.strerror or str(e)) from None
    try:
        data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise DesiredStateError(str(path), "file", path.name, f"not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {e}") from None
    return DesiredState.from_json(data, str(path), version=hashlib.sha256(raw).hexdigest()[:16])
