"""TaskControl dry runs (issue #28) against a real twine-controld on real etcd, with simulated agents
(named so; tests/controlplane/simagents.py): `twinectl job update FILE --dry-run` asks the job's
TaskController (the SDK's leader-last) in calls marked `dryRun: true` and prints the rounds the
update would take, followers first and the leader last; etcd's revision is the same after it, the
controller's own bookkeeping is untouched, and the real update that follows goes as printed. A
controller that does not know the flag is left with nothing in flight by the dry run's last call."""

from __future__ import annotations

import asyncio
import json

from controlplane.cli import twinectl
from controlplane.store import Store
from controlplane.taskcontrol.controllers.leader_last import LeaderLast
from controlplane.taskcontrol.sdk import Background, TaskController
from tests.controlplane.controld_proc import API_TOKEN, daemon_with_sim_agents

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.5, "memory_mb": 64}


def revision(c) -> int:
    async def read() -> int:
        store = Store([("127.0.0.1", c.etcd_port)])
        try:
            return (await store.range(f"/twine/{c.region}/"))[1]
        finally:
            await store.close()

    return asyncio.run(read())


def settled_revision(c, quiet: float = 1.5, timeout: float = 30) -> int:
    """etcd's revision once nothing has written for `quiet` seconds (what a stop leaves to do, done)."""
    import time

    deadline, last = time.monotonic() + timeout, revision(c)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = revision(c)
        if now == last:
            return now
        last = now
    raise AssertionError("etcd's revision kept changing")


def job_running(c, ent: str, name: str, count: int, url: str) -> dict:
    """An entitlement of `count` machines and a job of `count` tasks with a controller at `url`,
    running: the job's spec."""
    assert c.call("POST", "/v1/entitlements", {"name": ent, "machine_type": "generic", "quota": count,
                                             "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
    spec = {"entitlement": ent, "name": name, "count": count, "task": TASK, "controller": url}
    assert c.call("POST", "/v1/jobs", spec)[0] == 201
    c.wait_for(f"/v1/jobs/{ent}/{name}", lambda j: j["summary"].get("running") == count, what=f"{count} tasks running")
    return spec


class Unaware(TaskController):
    """A controller that knows nothing of dry runs (the flag stripped before the SDK sees it):
    acks everything, one at a time, keeping what it acked in flight until it hears it completed."""

    def process(self, body):
        return super().process({k: v for k, v in body.items() if not k.startswith("dryRun")})

    def decide(self, request):
        return [] if self.in_flight else list(request.ops[:1])


def test_a_dry_run_prints_followers_first_and_the_leader_last_and_changes_nothing(tmp_path, etcd_server, capsys):
    ctl = LeaderLast(lambda: 0)  # task 0 leads the ensemble
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("m1", "m2", "m3"), heartbeat_timeout=10.0) as (c, agents), \
            Background(ctl) as url:
        spec = job_running(c, "zk", "ensemble", 3, url)
        where = {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/zk/ensemble")[1]["tasks"]}
        f = tmp_path / "ensemble.yaml"  # JSON is YAML
        f.write_text(json.dumps({**spec, "task": {**TASK, "env": {"RELEASE": "2"}}}))
        url_args = ["--url", c.url, "--token", API_TOKEN]
        capsys.readouterr()
        before, starts = settled_revision(c), dict(agents.starts)
        assert twinectl.main([*url_args, "job", "update", str(f), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert revision(c) == before, "the dry run wrote nothing"
        assert dict(agents.starts) == starts and ctl.in_flight == {}
        lines = out.splitlines()
        assert lines[0] == ("dry run of zk/ensemble to v2: 3 task(s) in 3 round(s), as its TaskController, asked 4 "
                            "time(s) (dryRun: true); nothing changed"), out
        assert lines[1:4] == [f"round 1: restart #1 on {where[1]}", f"round 2: restart #2 on {where[2]}",
                              f"round 3: restart #0 on {where[0]}"], out
        dry = [call for call in ctl.calls if call.get("dryRun")]
        assert [call["ack"] for call in dry] == [["restart/1/v2"], ["restart/2/v2"], ["restart/0/v2"], []]
        j = c.call("GET", "/v1/jobs/zk/ensemble")[1]
        assert j["spec_version"] == 1 and all(t["spec_version"] == 1 for t in j["tasks"])

        # the update itself goes as the dry run said
        assert twinectl.main([*url_args, "job", "update", str(f), "--wait", "60"]) == 0
        real = [call["ack"] for call in ctl.calls if not call.get("dryRun") and call["ack"]]
        assert real == [["restart/1/v2"], ["restart/2/v2"], ["restart/0/v2"]], real


def test_a_controller_unaware_of_dry_runs_is_left_with_nothing_in_flight(tmp_path, etcd_server, capsys):
    ctl = Unaware()
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("m1", "m2"), heartbeat_timeout=10.0) as (c, _agents), \
            Background(ctl) as url:
        spec = job_running(c, "web", "api", 2, url)
        status, dry = c.call("POST", "/v1/jobs/web/api/dry-run", {**spec, "task": {**TASK, "env": {"V": "2"}}})
        assert status == 200 and [r["tasks"] for r in dry["rounds"]] == [[0], [1]], dry
        assert ctl.in_flight == {}, "the dry run's last call told it every op it acked completed"
        assert c.call("PUT", "/v1/jobs/web/api", {**spec, "task": {**TASK, "env": {"V": "2"}}})[0] == 200
        c.wait_for("/v1/jobs/web/api", lambda j: all(t["spec_version"] == 2 and t["state"] == "running"
                                                     for t in j["tasks"]), what="the real update")


def test_a_maintenance_dry_run_says_what_each_jobs_controller_would_move_and_schedules_nothing(tmp_path, etcd_server,
                                                                                              capsys):
    ctl = LeaderLast(lambda: 0)
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("m1", "m2", "m3"), heartbeat_timeout=10.0) as (c, _agents), \
            Background(ctl) as url:
        job_running(c, "zk", "ensemble", 3, url)
        where = {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/zk/ensemble")[1]["tasks"]}
        capsys.readouterr()
        before = settled_revision(c)
        assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "maintenance", "schedule", "--machine", where[0],
                              "--machine", where[1], "--start", "+1h", "--duration", "1h", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert revision(c) == before and c.call("GET", "/v1/maintenance")[1]["maintenance"] == []
        assert f"dry run of a maintenance of {where[0]}, {where[1]}" in out, out
        assert f"dry run of zk/ensemble before maintenance of {where[0]}, {where[1]}: 2 task(s) in 2 round(s)" in out, out
        assert f"round 1: move #1 on {where[1]}\nround 2: move #0 on {where[0]}" in out, "the follower first, the leader last"
        assert ctl.in_flight == {}


class OneAtATime(TaskController):
    def decide(self, request):
        return [] if self.in_flight else list(request.ops[:1])


def test_a_rebalance_plan_says_what_each_moves_controller_would_answer(tmp_path, etcd_server, capsys):
    from tests.controlplane.controld_proc import Controld
    from tests.controlplane.frontend.test_controld_api import register
    from tests.controlplane.rebalancer.test_apply_daemon import half_empty
    from tests.controlplane.simagents import SimAgents

    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0).start()
    ctl = OneAtATime()
    try:
        creds = {m: register(c, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url], interval=0.2), Background(ctl) as url:
            assert c.call("POST", "/v1/entitlements", {"name": "ctl", "machine_type": "generic", "quota": 3,
                                                     "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
            half_empty(c, "ctl", "api", controller=url)
            before = settled_revision(c)
            capsys.readouterr()
            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "plan", "--entitlement", "ctl"]) == 0
            out = capsys.readouterr().out
            assert "TASKCONTROL (dry run)" in out and "would ack now" in out, out
            assert revision(c) == before and ctl.in_flight == {}
            dry = [call for call in ctl.calls if call.get("dryRun")]
            assert len(dry) == 2 and dry[0]["ack"] == dry[0]["request"] and dry[1]["completed"] == dry[0]["ack"], dry
            assert dry[0]["request"][0].startswith("move/") and "/rebalance/" in dry[0]["request"][0]
    finally:
        c.close()
