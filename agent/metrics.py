"""The agent's metrics (`GET /metrics`), in Prometheus' text format by prometheus_client: made at
each scrape from the agent's status (status.py), so that the two never disagree. Names are the
ones the agent has always served."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

COUNTED = {  # the agent's counters, by key (the metric is twine_agent_<key>_total)
    "reconcile_passes": "reconcile passes", "reconcile_errors": "reconcile passes that failed",
    "tasks_started": "task containers started", "tasks_stopped": "task containers stopped",
}
HEALTH = (  # the health probe's numbers: (metric, help, how from the probe's report)
    ("twine_agent_healthy", "1 when the host's health probe finds no problem", lambda h: int(h["ok"])),
    ("twine_agent_docker_up", "1 when Docker answers", lambda h: int(h["docker"])),
    ("twine_agent_cpu_percent", "the host's CPU use, percent", lambda h: h["cpu_percent"]),
    ("twine_agent_memory_used_ratio", "the host's memory in use, 0-1", lambda h: h["memory_used"]),
    ("twine_agent_disk_used_ratio", "the state directory's disk in use, 0-1", lambda h: h["disk_used"]),
    ("twine_agent_load1", "the host's load average over a minute", lambda h: h["load"][0]),
    ("twine_agent_profile_drift_settings", "settings of the applied profile that no longer hold",
     lambda h: len(h["profile_drift"])),
)


class AgentCollector(Collector):
    def __init__(self, status: Callable[[], dict]):
        self.status = status  # status.status of the running agent

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        yield GaugeMetricFamily("twine_agent_up", "1 while the agent runs", value=1)
        tasks = GaugeMetricFamily("twine_agent_tasks", "desired tasks by state", labels=["state"])
        for state in ("running", "pending", "exited", "failed"):
            tasks.add_metric([state], sum(t["state"] == state for t in s["tasks"]))
        yield tasks
        restarts = GaugeMetricFamily("twine_agent_task_restarts", "restarts of each task's container",
                                     labels=["job", "index"])
        for t in s["tasks"]:
            restarts.add_metric([t["job"], str(t["index"])], t["restarts"])
        yield restarts
        prof = s["profile"]
        ready = GaugeMetricFamily("twine_agent_profile_ready", "1 when the desired profile is applied",
                                  labels=["profile"])
        ready.add_metric([prof["desired"] or ""], int(prof["ready"]))
        yield ready
        if prof["switch_seconds"] is not None:
            switch = GaugeMetricFamily("twine_agent_profile_switch_seconds", "how long the last profile switch took",
                                       labels=["profile"])
            switch.add_metric([prof["applied"]], prof["switch_seconds"])
            yield switch
        for name, value in s["counters"].items():
            yield CounterMetricFamily(f"twine_agent_{name}", COUNTED.get(name, name), value=value)
        if h := s["health"]:
            for name, help_, value in HEALTH:
                yield GaugeMetricFamily(name, help_, value=value(h))


def registry(status: Callable[[], dict]) -> CollectorRegistry:
    out = CollectorRegistry(auto_describe=False)
    out.register(AgentCollector(status))
    return out


def text(registry_: CollectorRegistry) -> str:
    return generate_latest(registry_).decode()
