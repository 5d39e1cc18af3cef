"""Reserved and used CPU and memory for Prometheus (issue #25), made at each scrape from the region's
view and its current usage (usage/region.py). Label sets are bounded by what the region has, never
by its tasks or machines: per job, per entitlement, and per dc × machine type × entitlement ("" for
the free pool); the free pool's machines by dc and machine type. Every replica serves the region's
figures (scrape one, or aggregate by max): they are sums the replicas share, not a replica's own."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.store.state import RegionState
from controlplane.usage.book import cell_of
from controlplane.usage.region import RegionUsage

MIB = 1 << 20


def _family(name: str, help_: str, labels: list[str], rows: dict[tuple, float]) -> GaugeMetricFamily:
    f = GaugeMetricFamily(name, help_, labels=labels)
    for key, value in sorted(rows.items()):
        f.add_metric(list(key), value)
    return f


class UsageCollector(Collector):
    def __init__(self, state: RegionState, usage: RegionUsage):
        self.state, self.usage = state, usage

    def collect(self) -> Iterator[Metric]:
        st = self.state
        jobs = self.usage.jobs()
        job_rows: dict[str, dict[tuple, float]] = {k: {} for k in ("cr", "cu", "mr", "mu")}
        ent_rows: dict[str, dict[tuple, float]] = {k: {} for k in ("cr", "cu", "mr", "mu")}
        for handle, job in st.jobs.items():
            cpus = float(job.task.get("cpus", 0)) * job.count
            mem = float(job.task.get("memory_mb", 0)) * job.count * MIB
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
        for m in st.machines.values():
            dc, _, ent, _, mtype = cell_of(m)
            key = (dc, mtype, ent)
            fleet["n"][key] = fleet["n"].get(key, 0) + 1
            fleet["cr"][key] = fleet["cr"].get(key, 0.0) + m.alloc_cpus
            fleet["mr"][key] = fleet["mr"].get(key, 0.0) + m.alloc_memory_mb * MIB
            if m.entitlement is None:
                pool[(dc, mtype)] = pool.get((dc, mtype), 0) + 1
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
