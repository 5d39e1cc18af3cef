"""Health probes: the host (psutil), the container runtime, and profile drift."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Above these the host is reported unhealthy: it cannot take more work safely.
MEMORY_LIMIT = 0.95
DISK_LIMIT = 0.95


@dataclass(frozen=True)
class HealthReport:
    ok: bool
    at: float
    cpu_percent: float
    memory_used: float  # ratio 0..1
    disk_used: float  # ratio 0..1, of the filesystem holding the state dir
    load: tuple[float, float, float]
    docker: bool
    drift: tuple[str, ...] = ()  # profile settings that no longer hold: "sysctl:vm.swappiness: is 35, wanted 33"
    problems: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {
            "ok": self.ok, "at": self.at, "cpu_percent": self.cpu_percent, "memory_used": round(self.memory_used, 4),
            "disk_used": round(self.disk_used, 4), "load": list(self.load), "docker": self.docker,
            "profile_drift": list(self.drift), "problems": list(self.problems),
        }


def probe(state_dir: Path, docker_up: bool, drift: tuple[str, ...]) -> HealthReport:
    mem = psutil.virtual_memory()
    disk = psutil.disk_usage(str(state_dir if state_dir.exists() else Path("/")))
    memory_used = 1 - mem.available / mem.total
    disk_used = disk.used / disk.total
    problems = []
    if not docker_up:
        problems.append("docker is not reachable")
    if memory_used > MEMORY_LIMIT:
        problems.append(f"memory {memory_used:.0%} used")
    if disk_used > DISK_LIMIT:
        problems.append(f"disk {disk_used:.0%} used")
    if drift:
        problems.append(f"{len(drift)} profile setting(s) drifted")
    return HealthReport(
        ok=not problems,
        at=time.time(),
        cpu_percent=psutil.cpu_percent(interval=None),
        memory_used=memory_used,
        disk_used=disk_used,
        load=os.getloadavg(),
        docker=docker_up,
        drift=drift,
        problems=tuple(problems),
    )
