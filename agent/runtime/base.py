"""What the agent needs from a container runtime, and what it learns back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

from agent.models import TaskKey, TaskSpec

# Labels every task container carries: how an agent knows, after a restart, what is its own.
L_MACHINE = "twine.machine"
L_JOB = "twine.job"
L_INDEX = "twine.task-index"
L_SPEC_VERSION = "twine.spec-version"
L_SPEC_HASH = "twine.spec-hash"
L_GENERATION = "twine.generation"  # 1 for the first container of a task spec, +1 per restart


def task_labels(machine_id: str, spec: TaskSpec, generation: int) -> dict[str, str]:
    return {
        L_MACHINE: machine_id,
        L_JOB: spec.job,
        L_INDEX: str(spec.index),
        L_SPEC_VERSION: str(spec.spec_version),
        L_SPEC_HASH: spec.spec_hash(),
        L_GENERATION: str(generation),
    }


def task_env(machine_id: str, spec: TaskSpec) -> dict[str, str]:
    """What every task is told of itself (the job's own env may not override these names)."""
    return {"TWINE_MACHINE": machine_id, "TWINE_JOB": spec.job, "TWINE_TASK_INDEX": str(spec.index),
            "TWINE_SPEC_VERSION": str(spec.spec_version)}


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    labels: Mapping[str, str]
    status: str  # docker's: created, running, paused, restarting, exited, dead
    exit_code: int | None
    started_at: str
    finished_at: str
    oom_killed: bool = False
    error: str = ""
    pid: int = 0  # its first process on the host, while it runs (its cgroup tells what it uses: agent/usage.py)

    @property
    def task(self) -> TaskKey:
        return TaskKey(self.labels[L_JOB], int(self.labels[L_INDEX]))

    @property
    def generation(self) -> int:
        return int(self.labels.get(L_GENERATION, "1"))

    @property
    def spec_hash(self) -> str:
        return self.labels.get(L_SPEC_HASH, "")

    @property
    def running(self) -> bool:
        return self.status in ("running", "restarting", "paused")

    def to_json(self) -> dict:
        return {
            "id": self.id, "name": self.name, "status": self.status, "exit_code": self.exit_code,
            "started_at": self.started_at, "finished_at": self.finished_at, "oom_killed": self.oom_killed,
            "error": self.error, "generation": self.generation,
        }


class ImageNotFound(Exception):
    """The image is not on this host and could not be pulled."""


class RuntimeUnavailable(Exception):
    """The container runtime (dockerd) does not answer."""


class ContainerRuntime(Protocol):
    cpu_limits: bool  # False: start tasks without a CPU limit (the profile turned the controller off)

    async def ping(self) -> bool: ...
    async def ensure_image(self, image: str) -> None: ...
    async def start(self, machine_id: str, spec: TaskSpec, generation: int) -> ContainerInfo: ...
    async def stop(self, container_id: str, grace: float) -> None: ...
    async def remove(self, container_id: str) -> None: ...
    async def inspect(self, container_id: str) -> ContainerInfo | None: ...
    async def list(self, machine_id: str) -> list[ContainerInfo]: ...
    async def logs(self, container_id: str, tail: int = 20) -> list[str]: ...
