"""The SRM in a real twine-controld on real etcd, with simulated agents (named so: no containers)
whose heartbeats report each job's load shared by its running tasks: a job grows with its load,
shrinks after scale_down_after by stopping the tasks that empty whole machines (which go back to the
free pool), and not while no machine would empty, is clamped by its entitlement's quota and says
so; a job without a policy is never resized; without measurements scale-in freezes and an event
says so."""

from __future__ import annotations

import pytest

from tests.controlplane.controld_proc import daemon_with_sim_agents, wait

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1, "memory_mb": 64}
POLICY = {"min": 1, "max": 20, "target_cpu": 0.5, "tolerance": 0.1, "predictive": False, "scale_down_after": 3,
          "max_changes_per_hour": 30}


@pytest.fixture(scope="module")
def region(tmp_path_factory, etcd_server):
    machines = tuple(f"s{i}" for i in range(6))
    with daemon_with_sim_agents(tmp_path_factory.mktemp("srm"), etcd_server.port, machines, heartbeat_timeout=5.0,
                                cpus=2, extra=("--srm-interval", "1", "--usage-sample", "0.5")) as (c, agents):
        agents.job_load = {}
        yield c, agents


@pytest.fixture(autouse=True)
def each_test_stops_its_jobs(region):
    """The tests share six machines: a test's jobs are stopped after it (pass or fail), so that
    their machines go back to the free pool."""
    yield
    c, agents = region
    for j in c.call("GET", "/v1/jobs")[1]["jobs"]:
        if j["state"] != "stopped":
            c.call("DELETE", f"/v1/jobs/{j['handle']}")
    for j in c.call("GET", "/v1/jobs")[1]["jobs"]:
        c.wait_for(f"/v1/jobs/{j['handle']}", lambda job: job["state"] == "stopped", what=f"{j['handle']} stopped")
    wait(lambda: all(m["entitlement"] is None for m in c.call("GET", "/v1/machines")[1]["machines"]), 30,
         "every machine back in the free pool")


def job(c, handle):
    return c.call("GET", f"/v1/jobs/{handle}")[1]


def autoscale(c, handle):
    status, body = c.call("GET", f"/v1/jobs/{handle}/autoscale")
    assert status == 200, body
    return body


def held_by(c, ent):
    return sorted(m["id"] for m in c.call("GET", "/v1/machines")[1]["machines"] if m["entitlement"] == ent)


def test_a_job_follows_its_load_and_a_scale_in_frees_whole_machines(region):
    c, agents = region
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 6})[0] == 201
    status, body = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2, "task": TASK,
                                               "autoscale": POLICY})
    assert status == 201, body
    assert body["autoscale"]["max"] == 20 and body["warnings"] == [
        "autoscale.max 20 is clamped to 12: entitlement web's quota of 6 generic machine(s) holds 2 task(s) of this "
        "size each (fewer while its other jobs hold some)"]
    still = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "static", "count": 1, "task": TASK})[1]
    assert still["autoscale"] is None
    status, body = c.call("POST", "/v1/jobs/web/api/resize", {"count": 5})
    assert status == 409 and body["field"] == "count" and "autoscaled" in body["why"]

    agents.job_load.update({"web/api": 3.0, "web/static": 5.0})  # 3 cores at 0.5 a task: 6 tasks
    wait(lambda: job(c, "web/api")["summary"].get("running") == 6, 30, "web/api grown to 6 running")
    a = autoscale(c, "web/api")
    assert a["events"][0]["was"] == 2 and a["events"][0]["to"] == 6 and "needs 6" in a["events"][0]["reason"]
    assert a["measured"]["per_task"] == 0.5 and a["measured"]["running"] >= 2

    agents.job_load["web/api"] = 30.0  # 60 tasks' worth: clamped by the quota (6 machines x 2, less static's 1)
    wait(lambda: job(c, "web/api")["count"] == 11, 30, "web/api clamped at 11")
    a = autoscale(c, "web/api")
    assert "quota holds 11" in a["clamped"], a
    wait(lambda: job(c, "web/api")["summary"].get("running") == 11, 30, "11 running")

    agents.job_load["web/api"] = 0.9  # 2 tasks' worth
    wait(lambda: job(c, "web/api")["count"] == 2, 30, "web/api shrunk to 2")
    # (the summary alone would hold before the scheduler's pass has begun to stop the chosen tasks)
    wait(lambda: job(c, "web/api")["summary"] == {"running": 2}, 30, "the chosen tasks stopped and gone")
    api, static = job(c, "web/api"), job(c, "web/static")
    machines = {t["machine"] for t in api["tasks"]} | {t["machine"] for t in static["tasks"]}
    # whole machines went back: web holds just the machines its tasks are on
    wait(lambda: held_by(c, "web") == sorted(machines), 30, "web holding only machines with its tasks")
    assert len(machines) <= 2, machines
    a = autoscale(c, "web/api")
    last = a["events"][-1]
    assert (last["was"], last["to"]) == (11, 2) and len(last["stopped"]) == 9 and "fit 2" in last["reason"]
    assert [h[1:] for h in a["history"]][-1] == [2, 2]
    assert job(c, "web/static")["count"] == 1, "a job without a policy is never resized"
    assert autoscale(c, "web/static")["policy"] is None


def test_a_scale_in_that_would_empty_no_machine_waits_for_one_that_does(region):
    c, agents = region
    assert c.call("POST", "/v1/entitlements", {"name": "whole", "machine_type": "generic", "quota": 3})[0] == 201
    assert c.call("POST", "/v1/jobs", {"entitlement": "whole", "name": "api", "count": 2, "task": TASK,
                                       "autoscale": POLICY})[0] == 201
    agents.job_load["whole/api"] = 3.0  # 6 tasks: the quota's 3 machines of 2 cores, full
    wait(lambda: job(c, "whole/api")["summary"].get("running") == 6, 30, "whole/api grown to 6 running")
    assert len(held_by(c, "whole")) == 3
    agents.job_load["whole/api"] = 2.4  # 5 tasks' worth: stopping one would empty no machine
    wait(lambda: "no machine empties at 5 or above" in autoscale(c, "whole/api")["reason"], 30,
         "the SRM holding 6 for want of a machine to empty")
    assert job(c, "whole/api")["count"] == 6 and len(held_by(c, "whole")) == 3
    agents.job_load["whole/api"] = 1.9  # 4 tasks' worth: one machine's fewer
    wait(lambda: job(c, "whole/api")["count"] == 4, 30, "whole/api shrunk to 4")
    wait(lambda: len(held_by(c, "whole")) == 2, 30, "one machine back in the free pool")
    last = autoscale(c, "whole/api")["events"][-1]
    assert (last["was"], last["to"]) == (6, 4) and "1 machine(s) emptied" in last["reason"], last


def test_without_measurements_scale_in_freezes_and_an_event_says_so(region):
    c, agents = region
    assert c.call("POST", "/v1/entitlements", {"name": "frozen", "machine_type": "generic", "quota": 6})[0] == 201
    status, body = c.call("POST", "/v1/jobs", {"entitlement": "frozen", "name": "api", "count": 4, "task": TASK,
                                               "autoscale": {**POLICY, "min": 1}})
    assert status == 201, body
    agents.job_load["frozen/api"] = 2.0  # 4 tasks' worth
    wait(lambda: "fits 4" in autoscale(c, "frozen/api")["reason"], 30, "measured at size 4")
    saved, agents.job_load = agents.job_load, None  # the agents stop reporting usage
    try:
        a = wait(lambda: (a := autoscale(c, "frozen/api"))["stale"] and a, 30, "the decision without measurements")
        assert "frozen" in a["reason"] and a["size"] == 4
        # the event is written at the end of the pass that decided (or the next one)
        open_ = wait(lambda: [e for e in c.call("GET", "/v1/events")[1]["events"]
                              if e["kind"] == "autoscale" and e["end"] is None], 30, "an open autoscale event")
        assert "scale-in is frozen" in open_[0]["reason"]
    finally:
        agents.job_load = {**saved, "frozen/api": 0.2}
    wait(lambda: not autoscale(c, "frozen/api")["stale"], 30, "measured again")
    wait(lambda: all(e["end"] is not None for e in c.call("GET", "/v1/events")[1]["events"] if e["kind"] == "autoscale"),
         30, "the autoscale event ended")
    # measured again: it waits scale_down_after before it shrinks
    wait(lambda: job(c, "frozen/api")["count"] == 1, 30, "frozen/api shrunk once measured")


def test_twinectl_job_autoscale_says_what_the_srm_does(region, capsys, tmp_path):
    from controlplane.cli import twinectl
    from tests.controlplane.controld_proc import API_TOKEN

    c, agents = region
    assert c.call("POST", "/v1/entitlements", {"name": "clients", "machine_type": "generic", "quota": 2})[0] == 201
    spec = tmp_path / "job.yaml"
    spec.write_text("entitlement: clients\nname: api\ncount: 1\n"
                    "task: {image: 'twine/busybox:1', command: [sleep, '3600'], cpus: 1, memory_mb: 64}\n"
                    "autoscale: {min: 1, max: 3, target_cpu: 0.5, scale_down_after: 300, predictive: false}\n")

    def ctl(*argv):
        return twinectl.main(["--url", c.url, "--token", API_TOKEN, *argv])

    assert ctl("job", "run", str(spec)) == 0
    out = capsys.readouterr().out
    assert "autoscale: 1 to 3 tasks" in out and "warning:" not in out, out
    agents.job_load["clients/api"] = 1.4  # 3 tasks' worth
    wait(lambda: job(c, "clients/api")["count"] == 3, 30, "clients/api at 3")
    assert ctl("job", "autoscale", "clients/api") == 0
    out = capsys.readouterr().out
    assert "policy:" in out and "1 to 3 tasks; cpu at 0.5 of each task's cpus" in out, out
    assert "RESIZES" in out and "load 1.40 needs 3 at 0.5 a task" in out, out
    assert ctl("job", "resize", "clients/api", "2") != 0
    assert "autoscaled" in capsys.readouterr().err


def test_the_job_page_draws_load_size_and_recommendation(region, tmp_path):
    """Figure 15 on the fleet page (Debian's Chromium): the job view of an autoscaled job shows its
    size, the recommendation and the reason as the API has them, a chart and its resizes."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.controlplane.controld_proc import API_TOKEN
    from tests.controlplane.frontend.test_fleet_page import chrome, sign_in

    c, agents = region
    assert c.call("POST", "/v1/entitlements", {"name": "paged", "machine_type": "generic", "quota": 2})[0] == 201
    assert c.call("POST", "/v1/jobs", {"entitlement": "paged", "name": "api", "count": 1, "task": TASK,
                                       "autoscale": POLICY})[0] == 201
    agents.job_load["paged/api"] = 0.9
    wait(lambda: job(c, "paged/api")["count"] == 2 and autoscale(c, "paged/api")["recommended"] == 2, 30,
         "paged/api at 2")
    driver = chrome(tmp_path)
    try:
        sign_in(driver, c.url, API_TOKEN, "job/paged/api")
        wait_ = WebDriverWait(driver, 20)
        shown = {k: wait_.until(EC.visibility_of_element_located((By.CSS_SELECTOR, f'[data-k="{k}"]'))).text
                 for k in ("autoscale-size", "autoscale-recommended", "autoscale-reason")}
        a = autoscale(c, "paged/api")
        assert shown["autoscale-size"] == "2" and shown["autoscale-recommended"] == str(a["recommended"])
        assert shown["autoscale-reason"].startswith("load "), shown
        assert driver.find_elements(By.CSS_SELECTOR, '[data-k="autoscale-chart"] canvas'), "uPlot drew the chart"
        rows = driver.find_elements(By.CSS_SELECTOR, '[data-k="resize"]')
        assert rows and "needs 2" in rows[0].text, [r.text for r in rows]
        driver.save_screenshot(str(tmp_path / "autoscale.png"))
        logs = driver.get_log("browser")
        assert not [e for e in logs if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]], logs
    finally:
        driver.quit()


class Endpoint:
    """An HTTP server on loopback, in a thread: GET answers `self.body`; POST (a TaskController
    call) is answered by `self.on_post(request body)`."""

    def __init__(self):
        import http.server
        import json
        import threading

        outer = self
        self.body, self.calls = b"0", []
        self.on_post = lambda req: {"ack": []}

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, data: bytes):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(outer.body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append(req)
                self._send(json.dumps(outer.on_post(req)).encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def test_a_task_its_controller_will_not_stop_is_swapped_for_another(region):
    c, agents = region
    ep = Endpoint()
    refused: set[int] = set()

    def controller(req):
        acks = []
        for op in req["request"]:
            i = op["task"]["index"]
            if op["kind"] == "stop" and (not refused or i in refused):
                refused.add(i)  # the first task it is asked to stop, it keeps: say, its shard's leader
                continue
            acks.append(op["id"])
        return {"ack": acks}

    ep.on_post = controller
    try:
        assert c.call("POST", "/v1/entitlements", {"name": "ctl", "machine_type": "generic", "quota": 3,
                                                   "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
        status, body = c.call("POST", "/v1/jobs", {"entitlement": "ctl", "name": "api", "count": 3, "task": TASK,
                                                   "controller": ep.url, "autoscale": POLICY})
        assert status == 201, body
        agents.job_load["ctl/api"] = 1.3  # 3 tasks' worth
        wait(lambda: job(c, "ctl/api")["summary"].get("running") == 3, 30, "3 running")
        agents.job_load["ctl/api"] = 0.9  # 2 tasks' worth
        wait(lambda: job(c, "ctl/api")["count"] == 2 and refused, 30, "a scale-in to 2, its stop refused")
        kept = next(iter(refused))
        a = wait(lambda: (a := autoscale(c, "ctl/api"))["events"] and "did not let" in a["events"][-1]["reason"] and a,
                 30, "the refused task swapped for another")
        other = a["events"][-1]["stopped"]
        assert other != [kept] and kept not in other, a["events"][-1]
        # (the simulated load may take the job past 3 on its way: what counts is that the kept task
        # runs, the offered one is gone, and two are left)
        def settled():
            ts = {t["index"]: t["state"] for t in job(c, "ctl/api")["tasks"]}
            return len(ts) == 2 and ts.get(kept) == "running" and not set(other) & set(ts)

        try:
            wait(settled, 60, "the other task stopped and gone")
        except AssertionError:
            j = job(c, "ctl/api")
            raise AssertionError(f"kept {kept}, offered {other}: tasks {[(t['index'], t['state']) for t in j['tasks']]}, "
                                 f"gaps {j['gaps']}, taskcontrol {j['taskcontrol']}, operations {j['operations']}, "
                                 f"events {autoscale(c, 'ctl/api')['events']}, calls {ep.calls[-5:]}") from None
        j = job(c, "ctl/api")
        assert kept in [t["index"] for t in j["tasks"] if t["state"] == "running"], j["tasks"]
        assert j["count"] == 2 and len(refused) == 1
    finally:
        ep.close()


def test_a_jobs_own_endpoint_is_its_load_and_an_unreadable_one_freezes_scale_in(region):
    c, agents = region
    ep = Endpoint()
    try:
        assert c.call("POST", "/v1/entitlements", {"name": "alm", "machine_type": "generic", "quota": 3,
                                                   "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
        ep.body = b'{"value": 250}'  # requests a second; a task should take 100
        policy = {**POLICY, "metric": {"http": ep.url + "/load", "target": 100}}
        status, body = c.call("POST", "/v1/jobs", {"entitlement": "alm", "name": "api", "count": 1, "task": TASK,
                                                   "autoscale": policy})
        assert status == 201, body
        wait(lambda: job(c, "alm/api")["count"] == 3, 30, "alm/api at 3 (250 / 100)")
        a = autoscale(c, "alm/api")
        assert a["measured"]["load"] == 250 and a["measured"]["per_task"] == 100
        ep.body = b"not a number"
        a = wait(lambda: (a := autoscale(c, "alm/api"))["stale"] and a, 30, "the decision without a reading")
        assert a["size"] == 3 and "frozen" in a["reason"]
        status, body = c.call("POST", "/v1/jobs", {"entitlement": "alm", "name": "prom", "count": 1, "task": TASK,
                                                   "autoscale": {**POLICY, "metric": {"prometheus": "sum(up)",
                                                                                      "target": 1}}})
        assert status == 422 and body["field"] == "autoscale.metric.prometheus", body
        status, body = c.call("POST", "/v1/jobs", {"entitlement": "alm", "name": "bad", "count": 1, "task": TASK,
                                                   "autoscale": {**POLICY, "min": 5, "max": 2}})
        assert status == 422 and body["field"] == "autoscale.min", body
        status, body = c.call("POST", "/v1/jobs", {"entitlement": "alm", "name": "bad", "count": 1, "task": TASK,
                                                   "autoscale": {**POLICY, "target_cpu": 1.5}})
        assert status == 400 and "autoscale" in body["field"] and "target_cpu" in body["field"], body
        assert c.call("GET", "/v1/jobs/alm/bad")[0] == 404, "a refused job wrote nothing"
    finally:
        ep.close()
