"""Opportunistic capacity's SLO for Prometheus (capacity/slo.py), from the process that leads
shard 0 (the others export nothing of it): per group (machine type/dc), the machines available and
the failure-domain buffer at the recorder's last look (a scrape makes no pass over the machines),
the line offered for the hour under way, and the hours judged and delivered."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from controlplane.capacity.recorder import CapacityRecorder


class CapacityCollector:
    def __init__(self, recorder: CapacityRecorder):
        self.recorder = recorder

    def collect(self) -> Iterator[Metric]:
        r = self.recorder
        if r.hour is None:  # not leading shard 0
            return
        avail = GaugeMetricFamily("twine_capacity_available_machines", "machines opportunistic work can use now "
                                  "(free, or an opportunistic entitlement's, in no reclaim)", labels=["group"])
        for group, f in sorted(r.last.items()):
            avail.add_metric([group], f["available"])
        yield avail
        buffer = GaugeMetricFamily("twine_capacity_buffer_machines", "the failure-domain buffer: the guaranteed "
                                   "machines of the group's largest MSB (lent to opportunistic work, not offered)",
                                   labels=["group"])
        for group, f in sorted(r.last.items()):
            buffer.add_metric([group], f.get("buffer", 0))
        yield buffer
        offered = GaugeMetricFamily("twine_capacity_offered_machines", "the SLO's line for the hour under way: "
                                    "machines available with 99 % probability, less the buffer", labels=["group"])
        for group, n in sorted(r.offered_now.items()):
            if n is not None:
                offered.add_metric([group], n)
        yield offered
        judged = GaugeMetricFamily("twine_capacity_slo_hours_judged", "hours with an offer made for them",
                                   labels=["group"])
        delivered = GaugeMetricFamily("twine_capacity_slo_hours_delivered", "of those, hours whose least "
                                      "available reached the offer", labels=["group"])
        for group, k in sorted(r.kept.items()):
            judged.add_metric([group], k["judged"])
            delivered.add_metric([group], k["delivered"])
        yield judged
        yield delivered
