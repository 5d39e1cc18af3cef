"""A job's TaskController may not be where controld should not call (issue #24): a clear 422 at
create and update, and, for a job whose entitlement no longer allows its controller's network,
no call at all: its status and an event say why."""

from __future__ import annotations

import time

from controlplane.taskcontrol.sdk import Background, TaskController
from tests.controlplane.controld_proc import daemon_with_sim_agents, wait

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.25, "memory_mb": 16}


class AckAll(TaskController):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def decide(self, request):
        self.asked += 1
        return request.ops


def test_refused_controller_addresses(tmp_path, etcd_server):
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2"), heartbeat_timeout=2.0) as (c, _agents):
        status, e = c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2,
                                                        "allow_controller_networks": ["10.1.2.3/8", "not-a-net"]})
        assert (status, e["field"]) == (422, "allow_controller_networks[1]"), e
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
        spec = {"entitlement": "web", "name": "api", "count": 2, "task": TASK}
        for url, words in [("http://169.254.169.254/latest/meta-data", "169.254.169.254, a link-local address"),
                           ("http://127.0.0.1:9/", "127.0.0.1, a loopback address"),
                           ("http://localhost:9/", "localhost resolves to"),  # 127.0.0.1 or ::1: loopback either way
                           ("http://[::1]:9/", "::1, a loopback address")]:
            status, answer = c.call("POST", "/v1/jobs", {**spec, "controller": url})
            assert (status, answer["field"]) == (422, "controller") and words in answer["why"], answer
            assert "allow_controller_networks" in answer["why"]
        assert c.call("GET", "/v1/jobs/web/api")[0] == 404, "a refused job wrote nothing"

        controller = AckAll()
        with Background(controller) as url:
            status, ent = c.call("PATCH", "/v1/entitlements/web", {"allow_controller_networks": ["127.0.0.1/8"]})
            assert status == 200 and ent["allow_controller_networks"] == ["127.0.0.0/8"], ent
            assert c.call("POST", "/v1/jobs", {**spec, "controller": url})[0] == 201
            wait(lambda: all(t["state"] == "running" for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]),
                 20, "2 tasks running")
            assert c.call("POST", "/v1/jobs/web/api/resize", {"count": 1})[0] == 200  # a stop for the controller
            wait(lambda: len(c.call("GET", "/v1/jobs/web/api")[1]["tasks"]) == 1, 20, "the stop its controller acked")
            # the stop's completion comes to the controller in a call of its own, up to the session's
            # interval after the task is gone (a fresh-clone run counted that call as one made after
            # the network was taken back): the calls are counted once it has come
            wait(lambda: controller.completed == 1, 20, "the stop's completion told to the controller")
            called = controller.asked
            assert called >= 1

            # the admin takes the network back: the controller is not called at its address any more
            assert c.call("PATCH", "/v1/entitlements/web", {"allow_controller_networks": []})[0] == 200
            status, answer = c.call("PUT", "/v1/jobs/web/api", {**spec, "count": 1, "controller": url})
            assert (status, answer["field"]) == (422, "controller"), answer
            assert c.call("POST", "/v1/jobs/web/api/resize", {"count": 0})[0] == 200  # a stop that needs its ack
            event = wait(lambda: next((e for e in c.call("GET", "/v1/events")[1]["events"] if e["kind"] == "controller"),
                                      None), 20, "an event of the refusal")
            assert event["scope"] == "web/api" and "127.0.0.1, a loopback address" in event["reason"], event
            job = c.call("GET", "/v1/jobs/web/api")[1]
            assert "refused to connect to 127.0.0.1" in job["taskcontrol"]["error"], job["taskcontrol"]
            assert len(job["tasks"]) == 1, "the stop waits for an ack that cannot come"
            time.sleep(1.5)
            assert controller.asked == called, "no call reached the controller after its network was taken back"
            events = [e for e in c.call("GET", "/v1/events")[1]["events"] if e["kind"] == "controller"]
            assert len(events) == 1, "said once, not at every call"
