"""twine-controld's metrics, served at /v1/metrics in Prometheus' text format by prometheus_client.

The components count in plain dicts of integers (a dict increment on every heartbeat and every
pass, no lock); at each scrape this collector turns them into counter families, and reads what is
a level (machines, jobs, open connections, shards led) from the region's view as gauges. The
histograms (scheduler/lifecycle.py, daemon/stalls.py) are prometheus_client's own, in the same
registry. The names are the ones this daemon has always served.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.listener import Listener
from controlplane.broker.agents import AgentService
from controlplane.broker.relay import Relay
from controlplane.coordination.coordinator import Coordinator
from controlplane.daemon.shards import ShardHost
from controlplane.health.check import HealthService
from controlplane.store.cells import HEALTHY, TOMBSTONED
from controlplane.store.state import RegionState
from controlplane.usage.fleet import in_maintenance

# what each component's counters count, by component and key (the metric is twine_<component>_<key>_total)
COUNTED = {
    "scheduler": {
        "passes": "passes over every job of a shard", "job_passes": "passes over one job",
        "commits": "transactions committed", "batches": "transactions of a job's changes too large for one",
        "conflicts": "commits that lost a race (the job is looked at again)",
        "placements": "placements committed", "errors": "job passes that failed",
        "rate_limited": "stop and move operations held by a rate limit, each once",
    },
    "agents": {
        "heartbeats": "heartbeats received", "heartbeat_reports": "heartbeats that carried a task report",
        "registrations": "machines registered", "long_polls": "desired-state long polls",
        "long_polls_refused": "desired-state long polls refused (--max-long-polls)",
        "usage_refused": "heartbeats refused for a usage figure beyond their host (negative, too large)",
    },
    "health": {
        "failures": "machines failed for silence", "recoveries": "machines healthy again",
        "examined": "machines looked at by the health check",
    },
    "coordination": {
        "elections_won": "shard leaderships begun", "depositions": "shard leaderships ended",
        "lease_renewals": "lease keep-alives answered", "lease_failures": "lease keep-alives that failed",
        "lease_answers_awaited_late": "lease keep-alives whose timeout ran late (the loop held): "
                                      "their answer was awaited half the lease margin more",
        "handovers": "shards handed to another member for balance",
    },
    "relay": {
        "sent": "relays sent to other members", "received": "relays received from other members",
        "failures": "relays that failed", "seen_relayed": "heartbeats relayed to their machine's health owner",
        "reports_relayed": "task reports relayed to the other members",
        "members_gone": "members whose key went (reports queue for them a while)",
        "members_back": "members back as the same process, sent what changed while they were gone",
    },
}


def _counter(name: str, help_: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_, value=value)


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=value)


Running = tuple[Coordinator | None, Relay | None, Listener | None]


class DaemonCollector(Collector):
    def __init__(self, state: RegionState, shards: ShardHost, agents: AgentService, health: HealthService,
                 running: Callable[[], Running]):
        self.state, self.shards, self.agents, self.health = state, shards, agents, health
        self.running = running  # what exists once the daemon runs: its coordinator, relay and listener

    def collect(self) -> Iterator[Metric]:
        coordinator, relay, listener = self.running()
        counted = {"scheduler": self.shards.counters(), "agents": self.agents.counters,
                   "health": self.health.counters, "coordination": coordinator.counters if coordinator else {},
                   "relay": relay.counters if relay else {}}
        for component, counters in counted.items():
            helps = COUNTED[component]
            for key, value in counters.items():
                yield _counter(f"twine_{component}_{key}", f"{component}: {helps.get(key, key)}", value)
        yield _counter("twine_ratelimit_held_operations", "stop and move operations held by a rate limit",
                       counted["scheduler"].get("rate_limited", 0))
        scheds = list(self.shards.schedulers.values())
        yield _gauge("twine_shards_led", "scheduler shards this process leads", len(scheds))
        yield _gauge("twine_health_intake_behind_seconds", "how far before now the health check's last pass "
                     "measured silence up to: heartbeats unread here or at a member then (daemon/intake.py)",
                     self.health.heard.behind)
        yield _gauge("twine_connections_open", "API connections open", listener.total if listener else 0)
        yield _counter("twine_connections_refused", "API connections refused (connection limits)",
                       listener.refused if listener else 0)
        yield _gauge("twine_taskcontrol_sessions", "TaskControl sessions of the shards led",
                     sum(len(sc.sessions) for sc in scheds))
        yield _gauge("twine_taskcontrol_failing", "TaskControl sessions whose controller's last call failed",
                     sum(sc.sessions.failing() for sc in scheds))
        yield from self._region()

    def _region(self) -> Iterator[Metric]:
        st, now = self.state, time.time()
        cells = st.cells  # the machines' sums kept as they change (store/cells.py): no pass over the machines
        yield _gauge("twine_records_skipped", "records under the region's prefix this daemon cannot read", len(st.skipped))
        yield _gauge("twine_machines", "machines in the region", len(st.machines))
        yield _gauge("twine_machines_unhealthy", "machines not healthy", len(st.machines) - cells.total(HEALTHY))
        # held by tasks moved off them whose containers are not reported gone (machine clean: the admin's way out)
        yield _gauge("twine_machines_with_tombstones", "machines holding tombstones",
                     cells.total(TOMBSTONED))
        yield _gauge("twine_machines_in_maintenance", "machines in a maintenance in progress",
                     len(in_maintenance(st, now)))
        yield _gauge("twine_machines_free", "machines in the free pool", sum(p[0] for p in cells.pool.values()))
        yield _gauge("twine_jobs", "jobs in the region", len(st.jobs))
        yield _gauge("twine_etcd_revision", "the etcd revision this daemon's view has", st.revision)


def registry() -> CollectorRegistry:
    """A daemon's registry (tests run several daemons in one process: never the global one)."""
    return CollectorRegistry(auto_describe=False)


class _Collected:
    """Families collected already, as generate_latest reads a registry."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


async def scrape(registry: CollectorRegistry) -> bytes:
    """/v1/metrics: the families collected on the event loop (the collectors read the region's
    view, which only the loop changes), their text written in a thread, with what a family leaves
    to be made when its samples are read (usage/metrics.py's fleet sums). At 1,000,000 machines a
    scrape was 5-8 ms of the loop's CPU, most of it the fleet's sums and its ~1,000 samples'
    text, and 15-22 ms of the loop's time on a busy two-core host: the longest stall while
    scraped (issue #38); 3-4 ms of CPU on the loop after."""
    families = list(registry.collect())
    return await asyncio.to_thread(generate_latest, _Collected(families))
