"""What a dev region's agent is: its name, where it stands (dc, msb, rack), its machine type and
capacity, and whether it owns the host's kernel-wide settings."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AgentSpec:
    name: str
    dc: str
    msb: str
    rack: str
    machine_type: str = "generic"
    cpus: float = 4.0
    memory_mb: int = 4096
    owns_kernel: bool = False


DEFAULT_AGENTS = (
    AgentSpec("m1", "dc1", "msb1", "rack1", cpus=2.0, memory_mb=2048),
    AgentSpec("m2", "dc1", "msb2", "rack2", cpus=2.0, memory_mb=2048),
    AgentSpec("m3", "dc2", "msb3", "rack3", cpus=2.0, memory_mb=2048),
)


def default_agents(kernel_owner: str | None = None) -> list[AgentSpec]:
    if kernel_owner is not None and kernel_owner not in {a.name for a in DEFAULT_AGENTS}:
        raise ValueError(f"--kernel-owner {kernel_owner}: not one of {[a.name for a in DEFAULT_AGENTS]}")
    return [replace(a, owns_kernel=a.name == kernel_owner) for a in DEFAULT_AGENTS]
