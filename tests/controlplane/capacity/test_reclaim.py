"""Reclaims (issue #37): a guaranteed job that finds no machine takes an opportunistic one back.
The opportunistic job's TaskController hears of it in advance notices with a `reclaim` operation
per task; acked, the task stops at once, else at the deadline; the machine then goes to the
guaranteed entitlement (not the pool), its task runs there, and the reclaim is over. Against a
real twine-controld and etcd, with simulated agents (named so: no containers run)."""

from __future__ import annotations

import time

import pytest

from controlplane.taskcontrol.sdk import Background, TaskController
from tests.controlplane.controld_proc import daemon_with_sim_agents, wait

BIG = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 3.0, "memory_mb": 64}  # one a machine


class AckReclaims(TaskController):
    """Acks a reclaim once it has seen its notice; nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.notices: list[dict] = []
        self.acking = False

    def decide(self, request):
        self.notices += [n.raw for n in request.notices]
        return [op for op in request.ops if op.kind == "reclaim"] if self.acking else []


def reclaims(c) -> list[dict]:
    return [e for e in c.call("GET", "/v1/events")[1]["events"] if e["kind"] == "reclaim"]


def holder(c, mid: str) -> str | None:
    return c.call("GET", f"/v1/machines/{mid}")[1]["entitlement"]


def setup(c, notice: float, controller: str | None = None) -> dict[int, str]:
    assert c.call("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 2,
                                               "kind": "opportunistic", "notice": notice,
                                               "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    job = {"entitlement": "batch", "name": "work", "count": 2, "task": BIG}
    if controller:
        job["controller"] = controller
    assert c.call("POST", "/v1/jobs", job)[0] == 201
    tasks = wait(lambda: (ts := c.call("GET", "/v1/jobs/batch/work")[1]["tasks"]) and all(
        t["state"] == "running" for t in ts) and len(ts) == 2 and ts, 20, "batch's two tasks running")
    return {t["index"]: t["machine"] for t in tasks}


def test_a_guaranteed_job_takes_an_opportunistic_machine_back_at_the_deadline(tmp_path, etcd_server, capsys):
    from controlplane.cli import twinectl
    from tests.controlplane.controld_proc import API_TOKEN

    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2"), heartbeat_timeout=5.0) as (c, _agents):
        def ctl(*argv):
            return twinectl.main(["--url", c.url, "--token", API_TOKEN, *argv])

        on = setup(c, notice=4.0)
        assert ctl("capacity", "pause") == 0 and "reclaims: paused" in capsys.readouterr().out
        # it does not fit now, and would once a machine is taken back: taken, its task pending
        status, job = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": BIG})
        assert status == 201, job
        too_big = {"entitlement": "web", "name": "huge", "count": 1, "task": {**BIG, "cpus": 8.0}}
        status, e = c.call("POST", "/v1/jobs", too_big)
        assert status == 422 and c.call("GET", "/v1/jobs/web/huge")[0] == 404, e  # no reclaim would make it fit
        time.sleep(2.0)
        assert reclaims(c) == [] and c.call("GET", "/v1/capacity")[1]["paused"] is True, "paused: no reclaim begins"
        assert ctl("capacity", "resume") == 0 and "reclaims: on" in capsys.readouterr().out
        [e] = wait(lambda: reclaims(c), 20, "a reclaim")
        assert ctl("capacity") == 0
        out = capsys.readouterr().out
        assert e["id"] in out and "batch" in out and "notice" in out, out
        assert (e["scope"], e["heir"], e["cause"], len(e["machines"])) == ("batch", "web", "demand", 1), e
        assert e["deadline"] - e["start"] == pytest.approx(4.0) and e["end"] is None, e
        [mid] = e["machines"]
        victim = next(i for i, m in on.items() if m == mid)
        # no controller: it runs out its notice
        while time.time() < e["deadline"] - 1.0:
            t = c.call("GET", "/v1/jobs/batch/work")[1]["tasks"][victim]
            assert (t["machine"], t["state"]) == (mid, "running"), t
            assert holder(c, mid) == "batch"
            time.sleep(0.2)
        wait(lambda: holder(c, mid) == "web", 20, "the machine given to web")
        assert time.time() >= e["deadline"]
        wait(lambda: [(t["machine"], t["state"]) for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]] == [(mid, "running")],
             20, "web's task running on the reclaimed machine")
        t = c.call("GET", "/v1/jobs/batch/work")[1]["tasks"][victim]
        assert (t["machine"], t["state"]) == (None, "pending") and "reclaim" in t["reason"], t
        [e] = wait(lambda: [x for x in reclaims(c) if x["end"] is not None], 20, "the reclaim over")
        other = on[1 - victim]
        assert holder(c, other) == "batch", "only what web needed was taken"


def test_a_reclaim_acked_by_the_controller_hands_the_machine_over_before_the_deadline(tmp_path, etcd_server):
    controller = AckReclaims()
    with Background(controller) as url, \
            daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2"), heartbeat_timeout=5.0) as (c, _agents):
        on = setup(c, notice=600.0, controller=url)
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": BIG})[0] == 201
        [e] = wait(lambda: reclaims(c), 20, "a reclaim")
        [mid] = e["machines"]
        notice = wait(lambda: next((n for n in controller.notices if n["id"] == e["id"]), None), 20, "the notice")
        assert (notice["kind"], notice["machines"], notice["deadline"]) == ("reclaim", [mid], e["deadline"]), notice
        assert notice["tasks"] == [i for i, m in on.items() if m == mid]
        time.sleep(1.0)
        assert holder(c, mid) == "batch", "unacked, it waits for its deadline (600 s)"
        controller.acking = True
        began = time.time()
        wait(lambda: [(t["machine"], t["state"]) for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]] == [(mid, "running")],
             20, "web's task running on the machine the controller gave up")
        assert time.time() - began < 20 and time.time() < e["deadline"]


def test_a_reclaim_whose_heir_needs_no_more_is_cancelled_and_the_opportunistic_task_runs_on(tmp_path, etcd_server):
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2"), heartbeat_timeout=5.0) as (c, agents):
        on = setup(c, notice=30.0)
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": BIG})[0] == 201
        [e] = wait(lambda: reclaims(c), 20, "a reclaim")
        [mid] = e["machines"]
        assert c.call("DELETE", "/v1/jobs/web/api")[0] == 202
        [e] = wait(lambda: [x for x in reclaims(c) if x["end"] is not None], 30, "the reclaim ended")
        assert "needs no more" in e["reason"] and e["end"] < e["deadline"], e
        assert holder(c, mid) == "batch"
        victim = next(i for i, m in on.items() if m == mid)
        t = c.call("GET", "/v1/jobs/batch/work")[1]["tasks"][victim]
        assert (t["machine"], t["state"]) == (mid, "running"), t
        assert agents.starts[("batch/work", victim, 1, mid)] == 1, "never stopped"


def test_a_guaranteed_task_lost_with_its_machine_takes_an_opportunistic_one_back_without_notice(tmp_path, etcd_server):
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2", "h3"), heartbeat_timeout=2.0) as (c, agents):
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": BIG})[0] == 201
        [web] = wait(lambda: [t["machine"] for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]
                              if t["state"] == "running"], 20, "web's task running")
        assert c.call("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 2,
                                                   "kind": "opportunistic", "notice": 600})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "batch", "name": "work", "count": 2, "task": BIG})[0] == 201
        wait(lambda: [t["state"] for t in c.call("GET", "/v1/jobs/batch/work")[1]["tasks"]] == ["running"] * 2, 20,
             "batch on the two other machines")
        agents.cut.add(web)  # its machine goes silent: failed after the heartbeat timeout
        cut = time.time()
        [e] = wait(lambda: reclaims(c), 30, "a reclaim")
        assert (e["cause"], e["deadline"], e["heir"]) == ("failure", e["start"], "web"), e  # no notice
        [mid] = e["machines"]
        wait(lambda: [(t["machine"], t["state"]) for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]] == [(mid, "running")],
             30, "web's task running on the machine taken from batch")
        print(f"\nweb's task running again {time.time() - cut:.1f} s after its machine went silent (timeout 2 s)")
        assert holder(c, mid) == "web"
        states = sorted(t["state"] for t in c.call("GET", "/v1/jobs/batch/work")[1]["tasks"])
        assert states == ["pending", "running"], states


def test_an_entitlements_disruption_budget_bounds_its_reclaims_in_flight_and_spaces_them(tmp_path, etcd_server,
                                                                                            capsys):
    """`reclaim` on an opportunistic entitlement: at most 1 machine in reclaim at once (though 100 %
    would allow both) and 600 s between two reclaims for demand; web needs both of batch's machines:
    it gets one, and the second only once the cool-down is set to 0 (twinectl modify, the other
    fields kept); a bad budget is refused naming the field, and changes nothing."""
    from controlplane.cli import twinectl
    from tests.controlplane.controld_proc import API_TOKEN

    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2"), heartbeat_timeout=5.0) as (c, _agents):
        def ctl(*argv):
            return twinectl.main(["--url", c.url, "--token", API_TOKEN, *argv])

        assert ctl("entitlement", "create", "batch", "--machine-type", "generic", "--quota", "2", "--kind",
                   "opportunistic", "--notice", "1", "--reclaim-max-machines", "1", "--reclaim-max-percent", "100",
                   "--reclaim-cooldown", "600") == 0
        assert "at most 1 machines or 100 % at once, 600 s apart" in capsys.readouterr().out
        status, e = c.call("PATCH", "/v1/entitlements/batch", {"reclaim": {"max_percent": 0}})
        assert status == 400 and "reclaim" in (e.get("field") or ""), e
        assert c.call("GET", "/v1/entitlements/batch")[1]["reclaim"] == {"max_machines": 1, "max_percent": 100.0,
                                                                         "cooldown": 600.0}
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "batch", "name": "work", "count": 2, "task": BIG})[0] == 201
        wait(lambda: [t["state"] for t in c.call("GET", "/v1/jobs/batch/work")[1]["tasks"]] == ["running"] * 2, 20,
             "batch on both machines")
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2, "task": BIG})[0] == 201
        [first] = wait(lambda: reclaims(c), 20, "a reclaim")
        assert len(first["machines"]) == 1, first
        wait(lambda: holder(c, first["machines"][0]) == "web", 20, "the first machine handed to web")
        time.sleep(3.0)
        assert [x["id"] for x in reclaims(c)] == [first["id"]], "no second reclaim within the cool-down"
        assert ctl("entitlement", "modify", "batch", "--reclaim-cooldown", "0") == 0
        assert "at most 1 machines or 100 % at once, 0 s apart" in capsys.readouterr().out
        second = wait(lambda: [x for x in reclaims(c) if x["id"] != first["id"]], 20, "the second reclaim")
        assert second[0]["machines"] != first["machines"]
        wait(lambda: [t["state"] for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]] == ["running"] * 2, 30,
             "web on both machines")


def test_the_reserve_is_refilled_with_notice_kept_from_batch_and_taken_at_once_by_growth(tmp_path, etcd_server, capsys):
    """`twinectl capacity reserve 1` with batch on all three machines: one is reclaimed with its
    notice for the reserve (no heir: it goes to the free pool) and batch's task stays pending
    rather than take it back; web's growth takes it at once, with no reclaim for demand; the
    reserve short again, another reclaim begins, and ends early once the reserve is set to 0. A bad
    reserve is refused naming the field, and changes nothing."""
    from controlplane.cli import twinectl
    from tests.controlplane.controld_proc import API_TOKEN

    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2", "h3"), heartbeat_timeout=5.0) as (c, _agents):
        def ctl(*argv):
            return twinectl.main(["--url", c.url, "--token", API_TOKEN, *argv])

        assert c.call("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 3,
                                                   "kind": "opportunistic", "notice": 3})[0] == 201
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "batch", "name": "work", "count": 3, "task": BIG})[0] == 201
        wait(lambda: [t["state"] for t in c.call("GET", "/v1/jobs/batch/work")[1]["tasks"]] == ["running"] * 3, 20,
             "batch on all three machines")
        for bad in ({"machines": -1}, {"machines": 10_001}, {"machines": "1"}, {"reserve": 1}):
            status, e = c.call("POST", "/v1/capacity/reserve", bad)
            assert status == 400 and e["field"] in ("machines", "reserve"), (bad, e)
        assert c.call("GET", "/v1/capacity")[1]["reserve"] == 0 and reclaims(c) == []
        assert ctl("capacity", "reserve", "1") == 0
        assert "reserve: 1 free machine(s) per machine type and dc" in capsys.readouterr().out
        [e] = wait(lambda: reclaims(c), 20, "a reclaim for the reserve")
        assert (e["scope"], e["heir"], e["cause"], len(e["machines"])) == ("batch", None, "reserve", 1), e
        assert e["deadline"] - e["start"] == pytest.approx(3.0), "the entitlement's notice"
        [mid] = e["machines"]
        wait(lambda: holder(c, mid) is None, 20, "the machine back in the free pool")
        assert time.time() >= e["deadline"]
        wait(lambda: [x for x in reclaims(c) if x["end"] is not None], 20, "the reclaim over")
        time.sleep(2.0)  # batch's stopped task finds only the reserve, and leaves it
        states = sorted((t["state"], t["machine"]) for t in c.call("GET", "/v1/jobs/batch/work")[1]["tasks"])
        assert [s for s, _ in states] == ["pending", "running", "running"] and mid not in {m for _, m in states}, states
        assert holder(c, mid) is None and c.call("GET", "/v1/capacity/forecast")[1]["groups"][0]["now"]["available"] == 2
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": BIG})[0] == 201
        [placed] = c.call("GET", "/v1/jobs/web/api")[1]["tasks"]
        assert placed["machine"] == mid, ("at once: placed on the reserve by the create's own commit, no notice "
                                          "waited", placed)
        wait(lambda: [(t["machine"], t["state"]) for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]] == [(mid, "running")],
             20, "web's task on the reserve")
        assert all(x["cause"] == "reserve" for x in reclaims(c)), "no reclaim for demand"
        refill = wait(lambda: [x for x in reclaims(c) if x["id"] != e["id"]], 20, "the reserve refilled")[0]
        assert (refill["heir"], refill["cause"]) == (None, "reserve"), refill
        assert ctl("capacity", "reserve", "0") == 0
        capsys.readouterr()
        [over] = wait(lambda: [x for x in reclaims(c) if x["id"] == refill["id"] and x["end"] is not None], 30,
                      "the refill ended")
        if over["end"] < over["deadline"]:  # (its notice may have run out before the reserve was set to 0)
            assert "the reserve needs no more" in over["reason"], over
