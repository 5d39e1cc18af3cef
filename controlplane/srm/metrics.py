"""The SRM's figures for Prometheus: per process (the shards it leads), never per job."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.srm.service import Autoscaler


class SrmCollector(Collector):
    def __init__(self, srm: Autoscaler):
        self.srm = srm

    def collect(self) -> Iterator[Metric]:
        srm, c = self.srm, self.srm.counters
        yield GaugeMetricFamily("twine_srm_jobs", "autoscaled jobs of the shards this process leads",
                                value=len(srm.memory))
        yield GaugeMetricFamily("twine_srm_stale_jobs", "of those, jobs whose last decision had no fresh measurement "
                                "(scale-in frozen)", value=sum(1 for v in srm.views.values()
                                                              if v.decision is not None and v.decision.stale
                                                              and v.at >= srm.clock() - 2 * srm.interval))
        resizes = CounterMetricFamily("twine_srm_resizes", "job size changes the SRM made", labels=["direction"])
        resizes.add_metric(["out"], c["resizes_out"])
        resizes.add_metric(["in"], c["resizes_in"])
        yield resizes
        yield CounterMetricFamily("twine_srm_swaps", "tasks chosen to stop that their TaskController kept, swapped "
                                  "for others", value=c["swaps"])
        yield CounterMetricFamily("twine_srm_passes", "SRM passes", value=c["passes"])
        yield CounterMetricFamily("twine_srm_conflicts", "resizes not written: the job changed meanwhile",
                                  value=c["conflicts"])
        yield CounterMetricFamily("twine_srm_decide_seconds", "time spent deciding jobs' sizes (no I/O in it)",
                                  value=c["decide_seconds"])
        yield CounterMetricFamily("twine_srm_recommendations", "recommendations made", value=c["recommendations"])
