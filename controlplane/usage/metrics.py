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
        # the fleet's families: their sums are made when their samples are first read, in the
        # scrape's thread (daemon/metrics.py scrape()), from copies of the cells taken here
        fleet = _Fleet(st.cells.rows, st.cells.pool, self.usage.cell_parts())
        labels = ["dc", "machine_type", "entitlement"]
        yield _Lazy("twine_fleet_machines", "machines by dc, type and entitlement (\"\": the free pool)", labels,
                    fleet, "n")
        yield _Lazy("twine_fleet_cpu_reserved_cores", "cores reserved by placed tasks", labels, fleet, "cr")
        yield _Lazy("twine_fleet_cpu_used_cores", "cores the tasks use", labels, fleet, "cu")
        yield _Lazy("twine_fleet_memory_reserved_bytes", "memory reserved by placed tasks", labels, fleet, "mr")
        yield _Lazy("twine_fleet_memory_used_bytes", "memory the tasks use", labels, fleet, "mu")
        yield _Lazy("twine_free_pool_machines", "machines in the free pool by dc and type", ["dc", "machine_type"],
                    fleet, "pool")


class _Fleet:
    """The fleet's figures by dc, machine type and entitlement, summed from copies of the region's
    cells (store/cells.py) and of each replica's usage cells taken on the event loop, once, when the
    first of its families is read. At 1,000,000 machines that is ~2,700 cells, and as many a
    replica: ~5 ms of CPU at each scrape, held on the loop until issue #38's sixth turn. The copies
    are of the mappings (a cell added or gone meanwhile is not seen); the figures are read as they
    are when summed: a heartbeat or commit applied on the loop meanwhile may show in some of them
    and not yet in others, as it would in the next scrape's."""

    def __init__(self, rows: dict, pool: dict, usage_parts: list[dict]) -> None:
        self.rows, self.pool, self.usage_parts = dict(rows), dict(pool), usage_parts
        self._sums: dict[str, dict[tuple, float]] | None = None

    def sums(self) -> dict[str, dict[tuple, float]]:
        if self._sums is None:
            fleet: dict[str, dict[tuple, float]] = {k: {} for k in ("n", "cr", "cu", "mr", "mu", "pool")}
            n, cr, mr, cu, mu = fleet["n"], fleet["cr"], fleet["mr"], fleet["cu"], fleet["mu"]
            for (dc, _, ent, _, mtype), r in self.rows.items():
                key = (dc, mtype, ent)
                n[key] = n.get(key, 0) + r[MACHINES]
                cr[key] = cr.get(key, 0.0) + r[RESERVED_CPU_M] / 1000
                mr[key] = mr.get(key, 0.0) + r[RESERVED_MB] * MIB
            for (mtype, dc), (machines, _) in self.pool.items():
                fleet["pool"][(dc, mtype)] = machines
            for part in self.usage_parts:  # straight into the families' keys: no sum per cell first
                for (dc, _, ent, _, mtype), figures in part.items():
                    key = (dc, mtype, ent)
                    cu[key] = cu.get(key, 0.0) + figures[0] / 1000
                    mu[key] = mu.get(key, 0.0) + figures[1] * MIB
            self._sums = fleet
        return self._sums


class _Lazy(GaugeMetricFamily):
    """A gauge family whose samples are _Fleet's sums, made when first read."""

    def __init__(self, name: str, help_: str, labels: list[str], fleet: _Fleet, which: str) -> None:
        self._filled = True  # Metric.__init__ sets samples
        super().__init__(name, help_, labels=labels)
        self._fleet, self._which, self._filled = fleet, which, False

    @property
    def samples(self) -> list:
        if not self._filled:
            self._filled = True
            for key, value in sorted(self._fleet.sums()[self._which].items()):
                self.add_metric(list(key), value)
        return self._samples

    @samples.setter
    def samples(self, value: list) -> None:
        self._samples = value
