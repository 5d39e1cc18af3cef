"""twine-controld's /v1/metrics come from prometheus_client (issue #23): every family has a type
and a help text, counters are counters and levels gauges, and the values are the daemon's own."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from controlplane.daemon import metrics
from tests.controlplane.controld_proc import API_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import register


def scrape(c: Controld) -> tuple[str, dict]:
    req = urllib.request.Request(c.url + "/v1/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def test_every_family_is_typed_and_explained_and_counts_what_happened(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port).start()
    try:
        for i in range(3):
            register(c, f"m{i}", "dc1", f"msb{i}")
        text, families = scrape(c)
        assert all(f.type in ("counter", "gauge", "histogram") for f in families.values()), \
            {n: f.type for n, f in families.items() if f.type not in ("counter", "gauge", "histogram")}
        assert all(f.documentation for f in families.values()), [n for n, f in families.items() if not f.documentation]
        for name in families:  # what prometheus_client's exposition writes for each
            assert f"# TYPE {name}" in text and f"# HELP {name}" in text
        kinds = {n: f.type for n, f in families.items()}
        assert kinds["twine_agents_registrations"] == "counter" and kinds["twine_scheduler_passes"] == "counter"
        assert kinds["twine_machines"] == kinds["twine_jobs"] == kinds["twine_shards_led"] == "gauge"
        assert kinds["twine_submit_to_running_seconds"] == kinds["twine_event_loop_lag_seconds"] == "histogram"
        value = {s.name: s.value for f in families.values() for s in f.samples if not s.labels}
        assert value["twine_agents_registrations_total"] == 3 and value["twine_machines"] == 3
        assert value["twine_machines_free"] == 3 and value["twine_shards_led"] == 1
        assert value["twine_etcd_revision"] > 0
    finally:
        c.close()


def scrape_on_a_loop(collector, noted: dict) -> tuple[bytes, object]:
    """metrics.scrape of a registry holding `collector`, on an event loop of its own (noted["loop"]:
    the loop's thread); and the registry."""
    registry = metrics.registry()
    registry.register(collector)

    async def main():
        noted["loop"] = threading.get_ident()
        return await metrics.scrape(registry)

    return asyncio.run(main()), registry


def test_a_scrape_collects_on_the_event_loop_and_writes_its_text_in_a_thread():
    """metrics.scrape: the collectors run on the loop (they read the region's view, which only the
    loop changes); the text, the larger part of a scrape's CPU, is written in another thread, and
    is what prometheus_client writes for the registry."""
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily

    seen: dict[str, int] = {}

    class Family(GaugeMetricFamily):
        @property
        def samples(self):  # read by add_metric, then by the exposition
            if "built" in seen:
                seen.setdefault("written", threading.get_ident())
            return self._samples

        @samples.setter
        def samples(self, value):
            self._samples = value

    class Collector:
        def collect(self):
            seen["collected"] = threading.get_ident()
            f = Family("twine_test_cells", "cells", labels=["dc"])
            for i in range(50):
                f.add_metric([f"dc{i}"], float(i))
            seen["built"] = 1
            yield f

    text, registry = scrape_on_a_loop(Collector(), seen)
    assert seen["collected"] == seen["loop"] and seen["written"] != seen["loop"]
    seen.clear()
    assert text == generate_latest(registry) and b'twine_test_cells{dc="dc49"} 49.0' in text
