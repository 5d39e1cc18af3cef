"""Reserved and used CPU and memory for Prometheus (issue #25), made at each scrape from the region's
view and its current usage (usage/region.py). Label sets are bounded by what the region has, never
by its tasks or machines: per job, per entitlement, and per dc × machine type × entitlement ("" for
the free pool); the free pool's machines by dc and machine type. Every replica serves the region's
figures (scrape one, or aggregate by max): they are sums the replicas share, not a replica's own."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.store.state import RegionState
from controlplane.store.cells import MACHINES, RESERVED_CPU_M, RESERVED_MB
from controlplane.usage.history import SERIES_BYTES
from controlplane.usage.recorder import Recorder
from controlplane.usage.region import RegionUsage

MIB = 1 << 20


def _family(name: str, help_: str, labels: list[str], rows: dict[tuple, float]) -> GaugeMetricFamily:
    f = GaugeMetricFamily(name, help_, labels=labels)
    for key, value in sorted(rows.items()):
        f.add_metric(list(key), value)
    return f


class UsageCollector(Collector):
    def __init__(self, state: RegionState, usage: RegionUsage, recorder: Recorder | None = None):
        self.state, self.usage, self.recorder = state, usage, recorder

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("twine_usage_machines_reporting", "machines whose last usage report this process holds "
                                "(its heartbeats came here)", value=len(self.usage.book.machines))
        series = self.recorder.series if self.recorder is not None else {}
        yield GaugeMetricFamily("twine_usage_series", "usage histories (jobs, entitlements) this process keeps as "
                                "their shard's leader", value=len(series))
        yield GaugeMetricFamily("twine_usage_history_bytes", "memory of those histories' points and rollups (as "
                                f"many as each holds, up to its window's: about {SERIES_BYTES} bytes a series)",
                                value=sum(s.nbytes() for s in series.values()))
        if self.recorder is not None:
            for k, v in self.recorder.counters.items():
                yield CounterMetricFamily(f"twine_usage_{k}", f"usage history: {k.replace('_', ' ')}", value=v)
        if (counters := getattr(self.usage.peer_tasks, "counters", None)) is not None:  # usage/peers.py
            yield CounterMetricFamily("twine_usage_peer_asks", "asks to another replica for its tasks' usage",
                                      value=counters["asked"])
            yield CounterMetricFamily("twine_usage_peer_ask_failures", "asks to another replica for its tasks' "
                                      "usage it did not answer in time (its tasks showed as not measured)",
                                      value=counters["failures"])
        st = self.state
        jobs = self.usage.jobs()
        job_rows: dict[str, dict[tuple, float]] = {k: {} for k in ("cr", "cu", "mr", "mu")}
        ent_rows: dict[str, dict[tuple, float]] = {k: {} for k in ("cr", "cu", "mr", "mu")}
        for handle, job in st.jobs.items():
            cpus, mem = job.resources()
            cpus, mem = cpus * job.count, mem * job.count * MIB
            used = jobs.get(handle)
            for rows, key in ((job_rows, (handle, job.entitlement)), (ent_rows, (job.entitlement,))):
                rows["cr"][key] = rows["cr"].get(key, 0.0) + cpus
                rows["mr"][key] = rows["mr"].get(key, 0.0) + mem
                if used is not None:
                    rows["cu"][key] = rows["cu"].get(key, 0.0) + used[0] / 1000
                    rows["mu"][key] = rows["mu"].get(key, 0.0) + used[1] * MIB
        for what, labels, rows in (("job", ["handle", "entitlement"], job_rows), ("entitlement", ["entitlement"], ent_rows)):
            yield _family(f"twine_{what}_cpu_reserved_cores", f"cores the {what}'s tasks reserve", labels, rows["cr"])
            yield _family(f"twine_{what}_cpu_used_cores", f"cores the {what}'s tasks use (as their agents last "
                          "measured; absent: none reports)", labels, rows["cu"])
            yield _family(f"twine_{what}_memory_reserved_bytes", f"memory the {what}'s tasks reserve", labels,
                          rows["mr"])
            yield _family(f"twine_{what}_memory_used_bytes", f"memory the {what}'s tasks use (working set)", labels,
                          rows["mu"])
        fleet: dict[str, dict[tuple, float]] = {k: {} for k in ("n", "cr", "cu", "mr", "mu")}
        pool: dict[tuple, float] = {}
        # the machines' sums kept as they change (store/cells.py): a pass over the cells, not the machines
        for (dc, _, ent, _, mtype), r in st.cells.rows.items():
            key = (dc, mtype, ent)
            fleet["n"][key] = fleet["n"].get(key, 0) + r[MACHINES]
            fleet["cr"][key] = fleet["cr"].get(key, 0.0) + r[RESERVED_CPU_M] / 1000
            fleet["mr"][key] = fleet["mr"].get(key, 0.0) + r[RESERVED_MB] * MIB
        for (mtype, dc), (n, _) in st.cells.pool.items():
            pool[(dc, mtype)] = n
        for (dc, _, ent, _, mtype), figures in self.usage.cells().items():
            key = (dc, mtype, ent)
            fleet["cu"][key] = fleet["cu"].get(key, 0.0) + figures[0] / 1000
            fleet["mu"][key] = fleet["mu"].get(key, 0.0) + figures[1] * MIB
        labels = ["dc", "machine_type", "entitlement"]
        yield _family("twine_fleet_machines", "machines by dc, type and entitlement (\"\": the free pool)", labels,
                      fleet["n"])
        yield _family("twine_fleet_cpu_reserved_cores", "cores reserved by placed tasks", labels, fleet["cr"])
        yield _family("twine_fleet_cpu_used_cores", "cores the tasks use", labels, fleet["cu"])
        yield _family("twine_fleet_memory_reserved_bytes", "memory reserved by placed tasks", labels, fleet["mr"])
        yield _family("twine_fleet_memory_used_bytes", "memory the tasks use", labels, fleet["mu"])
        yield _family("twine_free_pool_machines", "machines in the free pool by dc and type", ["dc", "machine_type"],
                      pool)
