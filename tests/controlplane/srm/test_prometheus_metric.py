"""An autoscale policy whose load is a Prometheus query, against Debian's prometheus server (its
instant query API) and a real twine-controld started with --prometheus-url: the job follows the
query's value; a query that returns nothing freezes scale-in."""

from __future__ import annotations

import os
import shutil

import pytest

from controlplane.security.pki import CA
from tests.controlplane.controld_proc import daemon_with_sim_agents, wait

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None and os.environ.get("CI") != "true",
                                reason="Debian's prometheus is not installed (scripts/setup.sh installs it)")
TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1, "memory_mb": 64}
POLICY = {"min": 1, "max": 5, "target_cpu": 0.5, "predictive": False, "scale_down_after": 3,
          "max_changes_per_hour": 30}


def test_a_job_sized_by_a_prometheus_query(tmp_path, etcd_server):
    from tests.promserver import PrometheusServer

    ca = CA(tmp_path / "ca")  # the server scrapes nothing here; its configuration names a CA all the same
    with PrometheusServer(tmp_path / "prometheus", "127.0.0.1:9", "unused", ca.cert) as prom:
        prom.wait("vector(1)", lambda r: bool(r))  # answering
        url = f"http://127.0.0.1:{prom.port}"
        with daemon_with_sim_agents(tmp_path, etcd_server.port, ("p1", "p2", "p3"), heartbeat_timeout=5.0,
                                    cpus=2, extra=("--srm-interval", "1", "--prometheus-url", url)) as (c, agents):
            assert c.call("POST", "/v1/entitlements", {"name": "prom", "machine_type": "generic", "quota": 3})[0] == 201
            status, body = c.call("POST", "/v1/jobs", {
                "entitlement": "prom", "name": "api", "count": 1, "task": TASK,
                "autoscale": {**POLICY, "metric": {"prometheus": "vector(250) + vector(0)", "target": 100}}})
            assert status == 201, body
            wait(lambda: c.call("GET", "/v1/jobs/prom/api")[1]["count"] == 3, 30, "prom/api at 3 (250 / 100)")
            a = c.call("GET", "/v1/jobs/prom/api/autoscale")[1]
            assert a["measured"]["load"] == 250 and "needs 3" in a["events"][-1]["reason"], a
            # a query with no series: no reading, scale-in frozen
            status, body = c.call("POST", "/v1/jobs", {
                "entitlement": "prom", "name": "none", "count": 2, "task": TASK,
                "autoscale": {**POLICY, "metric": {"prometheus": 'up{job="no-such-job"}', "target": 100}}})
            assert status == 201, body
            a = wait(lambda: (a := c.call("GET", "/v1/jobs/prom/none/autoscale")[1]).get("stale") and a, 30,
                     "prom/none decided without a reading")
            assert a["size"] == 2 and "frozen" in a["reason"]
