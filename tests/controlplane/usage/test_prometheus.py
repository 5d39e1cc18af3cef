"""Debian's Prometheus server, for real, scrapes twine-controld over TLS with a token, and the usage
figures come back through Prometheus' query API (issue #25)."""

from __future__ import annotations

import os
import threading

import pytest

from controlplane.security.pki import CA
from tests.controlplane.controld_proc import API_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import TASK, register
from tests.promserver import PROMETHEUS, PrometheusServer


@pytest.mark.skipif(PROMETHEUS is None and os.environ.get("CI") != "true",
                    reason="Debian's prometheus is not installed (scripts/setup.sh installs it)")
def test_prometheus_scrapes_controld_over_tls_with_a_token_and_reads_usage_back(tmp_path, etcd_server):
    ca = CA(tmp_path / "pki")
    pair = ca.issue("controld")
    c = Controld(tmp_path, etcd_server.port, ca=ca.cert,
                 extra=("--tls-cert", str(pair.cert), "--tls-key", str(pair.key), "--tls-ca", str(ca.cert))).start()
    stop = threading.Event()
    try:
        cred = register(c, "m1", "dc1", "msb1", cpus=4, memory_mb=4096)
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK})[0] == 201
        usage = {"window": 1.0, "cpus": 4, "cpu": 1.3, "memory_mb": 900.0, "memory_total_mb": 4096.0,
                 "tasks": [["web/api", 0, 0.98, 50.0]]}
        beat = {"machine_id": "m1", "digest": "a", "tasks": [], "profile": {"name": None, "ok": True}, "usage": usage}

        def heartbeats():
            while not stop.is_set():
                c.call("POST", "/v1/agent/heartbeat", beat, token=cred)
                stop.wait(0.5)

        threading.Thread(target=heartbeats, daemon=True).start()
        with PrometheusServer(tmp_path / "prometheus", f"127.0.0.1:{c.port}", API_TOKEN, ca.cert) as prom:
            got = prom.wait('twine_job_cpu_used_cores{handle="web/api"}')
            assert prom.query('up{job="twine-controld"}')[0]["value"][1] == "1"
            assert float(got[0]["value"][1]) == pytest.approx(0.98) and got[0]["metric"]["entitlement"] == "web"
            reserved = prom.query('twine_entitlement_cpu_reserved_cores{entitlement="web"}')
            assert float(reserved[0]["value"][1]) == TASK["cpus"]
            held = prom.wait('twine_fleet_machines{entitlement="web",dc="dc1",machine_type="generic"}')
            assert float(held[0]["value"][1]) == 1 and prom.query("twine_free_pool_machines") == []  # m1 is web's
    finally:
        stop.set()
        c.close()
