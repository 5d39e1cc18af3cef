"""What the agent tells twine-controld (docs/api.md, "Agents"): the machine at registration, and
the task report of its heartbeats with the digest that lets an unchanged report be left out."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import psutil

from agent.config import AgentConfig
from agent.models import TaskSpec
from agent.profiles import appliers
from agent.reconcile import parse_time
from agent.runtime.base import L_SPEC_VERSION, ContainerInfo

HUGEPAGES = Path("/sys/kernel/mm/hugepages")
CGROUP2_MARKER = Path("/sys/fs/cgroup/cgroup.controllers")
# A task is steady once Docker, asked this long or more after its container started, said it runs:
# the agent's own observation on its own clock, which a rollout's batch waits for (a container that
# exits at once is restarted by the agent, and the control plane may hear of the exit late).
STEADY_AFTER = 5.0


def capacity(config: AgentConfig) -> dict:
    """The host's capacity for registration; cpus and memory_mb may be claimed shares (config)."""
    disk = psutil.disk_usage(str(config.state_dir if config.state_dir.exists() else Path("/")))
    try:
        pages = sorted(int(n[len("hugepages-"):-len("kB")]) for n in os.listdir(HUGEPAGES) if n.startswith("hugepages-"))
    except OSError:
        pages = []
    return {
        "cpus": config.cpus or float(psutil.cpu_count() or 1),
        "memory_mb": config.memory_mb or psutil.virtual_memory().total >> 20,
        "disk_gb": round(disk.total / 2**30, 1),
        "hugepage_sizes_kb": pages,
        "cgroup_version": 2 if CGROUP2_MARKER.exists() else 1,
        "supports": list(appliers.known()),
    }


def agent_version() -> str:
    try:
        return metadata.version("twine")
    except metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def machine_info(config: AgentConfig) -> dict:
    """The body of POST /v1/agent/register."""
    return {
        "machine_id": config.machine_id,
        "hostname": config.hostname,
        "labels": asdict(config.labels),
        "capacity": capacity(config),
        "address": config.address or config.listen,
        "version": agent_version(),
    }


def steady(c: ContainerInfo, listed_at: float | None) -> bool:
    """The container ran when Docker was asked at `listed_at`, STEADY_AFTER or more after it started."""
    started = parse_time(c.started_at)
    return c.running and listed_at is not None and started is not None and listed_at - started >= STEADY_AFTER


def _container_report(c: ContainerInfo, error: str, listed_at: float | None) -> dict:
    state = "running" if c.running else "starting" if c.status == "created" else "exited"
    return {
        "job": c.task.job, "index": c.task.index, "spec_version": int(c.labels.get(L_SPEC_VERSION, "0")),
        # the first container of a task is generation 1: it restarted generation - 1 times (as agent/status.py says)
        "state": state, "exit_code": c.exit_code, "restarts": max(c.generation - 1, 0), "error": error,
        "steady": steady(c, listed_at),
    }


def task_reports(containers: list[ContainerInfo], desired: tuple[TaskSpec, ...], errors: dict[str, str],
                 listed_at: float | None = None) -> list[dict]:
    """One entry per container of this machine, plus desired tasks that failed to get one.
    `listed_at`: when Docker last listed the containers (a container started since is not steady)."""
    out = [_container_report(c, errors.get(str(c.task), ""), listed_at) for c in containers]
    have = {c.task for c in containers}
    out += [
        {"job": t.job, "index": t.index, "spec_version": t.spec_version, "state": "failed",
         "exit_code": None, "restarts": 0, "error": errors[str(t.key)], "steady": False}
        for t in desired if t.key not in have and str(t.key) in errors
    ]
    return sorted(out, key=lambda r: (r["job"], r["index"], r["restarts"]))


def report_digest(profile: dict, tasks: list[dict]) -> str:
    """sha256 of the canonical JSON of profile and tasks: unchanged digest, unchanged report."""
    canonical = json.dumps({"profile": profile, "tasks": tasks}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
