"""GET /v1/rebalance/plan and `twinectl rebalance plan` against a real twine-controld on real etcd,
with simulated agents (named so: no containers): two half-empty machines of one MSB, and the plan
that frees one of them, in words; a dry run: nothing moves."""

from __future__ import annotations

from controlplane.cli import twinectl
from tests.controlplane.controld_proc import API_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import register
from tests.controlplane.simagents import SimAgents

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "memory_mb": 64}


def test_the_plan_frees_a_half_empty_machine_and_moves_nothing(tmp_path, etcd_server, capsys):
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0).start()
    try:
        creds = {m: register(c, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url], interval=0.2):
            assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 3})[0] == 201
            for name, cpus in (("big", 1.2), ("small", 0.8)):  # big: one a machine; small fills up what is left
                status, body = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": name, "count": 2,
                                                           "task": {**TASK, "cpus": cpus}})
                assert status == 201, body
                c.wait_for(f"/v1/jobs/web/{name}", lambda j: j["summary"].get("running") == 2, what=f"{name} running")
            c.call("DELETE", "/v1/jobs/web/big")
            c.wait_for("/v1/jobs/web/big", lambda j: j["state"] == "stopped", what="big stopped")
            small = {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/small")[1]["tasks"]}
            assert len(set(small.values())) == 2, small  # each of the two machines is 0.8 of 2 cores full

            status, p = c.call("GET", "/v1/rebalance/plan?entitlement=web")
            assert status == 200, p
            assert p["goals"]["compaction"]["machines_held"] == {"before": 2, "after": 1}
            assert p["goals"]["compaction"]["stranded_cpus"] == {"before": 2.4, "after": 0.4}
            (mv,) = p["moves"]
            assert mv["job"] == "web/small" and small[mv["index"]] == mv["source"] and mv["target"] in small.values()
            assert p["freed"] == [mv["source"]] and mv["why"] == f"compaction: frees {mv['source']}"
            assert "entitlement web holds 2 machines whose 4 cores are 1.6 reserved: moving 1 task(s) within their " \
                "MSBs frees 1 machine(s) for the free pool" in p["summary"], p["summary"]
            assert p["groups"][0]["status"].startswith("optimal")

            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "plan"]) == 0
            text = capsys.readouterr().out
            assert text.startswith("repair: nothing to repair") and "entitlement web holds 2 machines" in text
            assert "compaction: machines held  2       1" in text and "hotspots: hottest msb      -       -" in text, text
            assert f"web/small#{mv['index']}" in text and "a dry run: nothing moved" in text, text
            # a dry run: the tasks are where they were
            assert {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/small")[1]["tasks"]} == small
            assert c.call("GET", "/v1/rebalance/plan?entitlement=nope")[0] == 404
            status, body = c.call("GET", "/v1/rebalance/plan?entitlement=NOT%20A%20NAME")
            assert status == 400 and body["field"] == "entitlement"

            # a round's move budget: none, then the one move that frees the machine
            status, p = c.call("GET", "/v1/rebalance/plan?entitlement=web&max_moves=0")
            assert status == 200 and p["moves"] == [] and p["freed"] == [] and p["max_moves"] == 0, p
            assert p["summary"][0] == "budget: at most 0 move(s) this round, 0 planned: hotspots first, then the " \
                "machines cheapest to free, then repair", p["summary"]
            status, p = c.call("GET", "/v1/rebalance/plan?max_moves=1")
            assert status == 200 and p["max_moves"] == 1 and [m["source"] for m in p["moves"]] == [mv["source"]], p
            assert p["freed"] == [mv["source"]] and p["moves"][0]["why"] == f"compaction: frees {mv['source']} (1 move(s))"
            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "plan", "--max-moves", "1"]) == 0
            assert capsys.readouterr().out.startswith("budget: at most 1 move(s) this round, 1 planned")
            for bad in ("-1", "1.5", "abc", "100001", "%D9%A3"):  # (an Arabic-Indic digit three)
                status, body = c.call("GET", f"/v1/rebalance/plan?max_moves={bad}")
                assert status == 400 and body["field"] == "max_moves" and "0 to 100000" in body["why"], (bad, body)
            status, body = c.call("POST", "/v1/rebalance/apply?max_moves=x")
            assert status == 400 and body["field"] == "max_moves", body
            assert c.call("GET", "/v1/rebalance")[1]["requested"] == 0, "a refused round requests nothing"
    finally:
        c.close()


def test_the_hotspot_goal_sees_the_machine_its_hot_task_heats_not_the_jobs_mean(tmp_path, etcd_server):
    """Issue #35: two tasks of one job on one machine use 1.0 and 0.7 core of its 2, the job's third
    task 0.05 on another: that machine is hot (85 %). With each task taken at its job's mean (0.58
    core) no machine was (58 % at most), and the hottest task stayed where it was."""
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0).start()
    try:
        creds = {m: register(c, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url], interval=0.2) as agents:
            assert c.call("POST", "/v1/entitlements", {"name": "hot", "machine_type": "generic", "quota": 3})[0] == 201
            status, body = c.call("POST", "/v1/jobs", {"entitlement": "hot", "name": "api", "count": 3,
                                                       "task": {**TASK, "cpus": 0.75}})
            assert status == 201, body
            job = c.wait_for("/v1/jobs/hot/api", lambda j: j["summary"].get("running") == 3, what="api running")
            where = {t["index"]: t["machine"] for t in job["tasks"]}
            pair = [i for i in where if list(where.values()).count(where[i]) == 2]
            assert len(pair) == 2, where  # the allocator packs (best fit): two on one machine, one on another
            (lone,) = set(where) - set(pair)
            hot, hottest = where[pair[0]], pair[0]
            agents.task_figures = {("hot/api", hottest): (1.0, 50.0), ("hot/api", pair[1]): (0.7, 50.0),
                                   ("hot/api", lone): (0.05, 10.0)}
            c.wait_for("/v1/jobs/hot/api/usage?tasks=1", what="each task's figures",
                       predicate=lambda u: {t["index"]: t["cpus"] for t in u["tasks"]} == {hottest: 1.0, pair[1]: 0.7,
                                                                                            lone: 0.05})

            status, p = c.call("GET", "/v1/rebalance/plan?entitlement=hot")
            assert status == 200, p
            assert p["goals"]["hotspots"]["hot_machines"] == {"before": 1, "after": 0}, p["goals"]
            (mv,) = [mv for mv in p["moves"] if mv["goal"] == "hotspots"]
            assert (mv["job"], mv["index"], mv["source"], mv["target"]) == ("hot/api", hottest, hot, where[lone]), mv
            assert mv["why"] == f"hotspots: {hot} uses 85% of its cores (hot above 80%)", mv
    finally:
        c.close()
