"""A job's TaskControl record in etcd (taskcontrol/sessions.py), through a real controld whose
simulated agents (named so: tests/controlplane/simagents.py) run the tasks: what a next leader
would take up is what is still to tell the controller, and no more once an update is over."""

from __future__ import annotations

import asyncio
import time

from controlplane.store import Store
from controlplane.store.codec import decode
from controlplane.store.keys import Keys
from controlplane.taskcontrol.sdk import Background, TaskController
from tests.controlplane.controld_proc import daemon_with_sim_agents
from tests.controlplane.taskcontrol.test_dry_run import TASK, job_running


class OneAtATime(TaskController):
    def decide(self, request):
        return [] if self.in_flight else list(request.ops[:1])


def record(c, handle: str) -> dict | None:
    async def read() -> dict | None:
        store = Store([("127.0.0.1", c.etcd_port)])
        try:
            got = await store.read(Keys(c.region).taskcontrol(handle))
            return None if got is None or got.value is None else got.value
        finally:
            await store.close()
    return asyncio.run(read())


def test_after_a_rolling_update_the_record_keeps_no_completion_the_controller_heard_of(tmp_path, etcd_server):
    """A rolling update of three tasks, one at a time. Once the controller heard of every completion
    the record holds nothing, commit or not: before, the update's last operation stayed listed in
    flight (no commit followed its completion), to be reported again by every later leader. (The
    completions a record keeps while their report is out: test_session.py.)"""
    ctl = OneAtATime()
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("m1", "m2", "m3"), heartbeat_timeout=10.0) as (c, _a), \
            Background(ctl) as url:
        spec = job_running(c, "web", "api", 3, url)
        assert c.call("PUT", "/v1/jobs/web/api", {**spec, "task": {**TASK, "env": {"V": "2"}}})[0] == 200
        kept = []  # what samples of the record showed kept on the way (the window is short: often none)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = record(c, "web/api") or {}
            kept += [op["id"] for op in r.get("completed", [])]
            j = c.call("GET", "/v1/jobs/web/api")[1]
            if all(t["spec_version"] == 2 and t["state"] == "running" for t in j["tasks"]) and not ctl.in_flight \
                    and r == {"in_flight": []}:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the record still holds {record(c, 'web/api')}; controller in flight {ctl.in_flight}")
        print(f"completions kept in the record on the way: {sorted(set(kept))}")
        assert set(kept) <= {"restart/0/v2", "restart/1/v2", "restart/2/v2"}
