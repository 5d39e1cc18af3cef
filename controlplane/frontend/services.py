"""What the front end is given to work with (make_app's one argument), and the narrow interface it
sees of the scheduler shards this process leads. Each group of handlers receives only the
services it uses, never the daemon."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Protocol

from controlplane.broker.agents import AgentService
from controlplane.capacity.recorder import CapacityRecorder
from controlplane.broker.relay import Relay
from controlplane.coordination.coordinator import Coordinator
from controlplane.frontend.forward import Forwarder
from controlplane.opsplanner.planner import OpsPlanner
from controlplane.scheduler.service import Scheduler
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach
from controlplane.usage.recorder import Recorder
from controlplane.usage.region import RegionUsage
from controlplane.srm.service import Autoscaler


class Shards(Protocol):
    """The scheduler shards this process leads now."""

    def scheduler_for(self, handle: str) -> Scheduler | None:
        """The local scheduler of the job's shard, if this process leads it."""

    def local(self, shard: int) -> Scheduler | None:
        """The shard's scheduler, if this process leads it."""


@dataclass(frozen=True)
class Settings:
    region: str
    roles: tuple[str, ...]  # what this process does (frontend, scheduler, health)
    api_tokens: set[str]  # --api-token-file's: admin tokens
    body_timeout: float  # seconds a request has to send its body
    profile_search: tuple[Path, ...] | None  # where an entitlement's profile must load from


@dataclass(frozen=True)
class Services:
    settings: Settings
    state: RegionState  # the region's view, and its writes (write-and-wait)
    shards: Shards
    agents: AgentService  # the resource broker's side of the agents
    ops: OpsPlanner  # planned maintenance
    clean: Callable[[str], Awaitable[None]]  # an admin's word that a machine runs none of its tombstones
    forwarder: Forwarder
    coordinator: Coordinator | None
    relay: Relay | None
    reach: Reach  # where TaskControllers may be
    metrics: Callable[[], str]  # the Prometheus text of /v1/metrics
    usage: RegionUsage  # what the region uses now
    recorder: Recorder | None  # the usage history of the shards this process leads
    srm: Autoscaler | None = None  # the SRM of the shards this process leads
    capacity: CapacityRecorder | None = None  # the pool's history (opportunistic capacity's SLO)
    prometheus_url: str | None = None  # the region's Prometheus server (autoscale metrics may query it)
