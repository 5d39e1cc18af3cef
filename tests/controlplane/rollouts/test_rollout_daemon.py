"""Host-profile rollouts against a real twine-controld on real etcd, with simulated agents (named
so: no containers, no kernel; tests/controlplane/simagents.py; the real agents and kernels are in
tests/e2e/test_rollout.py and tests/vm/test_rollout.py): a profile change (another name, then an
edit of its file on the control host) reaches the machines one at a time, each machine's task
offered to the job's TaskController as a `reprofile` operation and stopped before its machine
switches, started after; a profile the agents cannot apply fails the first batch, which is rolled
back, and the other machines never change; an admin pauses, resumes and rolls back."""

from __future__ import annotations

import threading
import time

from controlplane.cli import twinectl
from controlplane.taskcontrol.sdk import Background, TaskController
from tests.controlplane.controld_proc import API_TOKEN, daemon_with_sim_agents

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.5, "memory_mb": 64}
MACHINES = ("m1", "m2", "m3")


class OneAtATime(TaskController):
    """Acks one operation while nothing it acked is in flight and no task is down; keeps every op."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str, int, str | None]] = []

    def decide(self, request):
        self.seen += [(op.kind, op.reason, op.index, op.machine) for op in request.ops]
        if self.in_flight or request.unhealthy:
            return []
        return list(request.ops[:1])


class Phases:
    """Samples the rollout every 20 ms: the machines in a batch's phases at once, and the phases each passed."""

    def __init__(self, c, name: str):
        self.c, self.name = c, name
        self.most_at_once = 0
        self.passed: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            status, r = self.c.call("GET", f"/v1/entitlements/{self.name}/rollout")
            if status == 200:
                busy = [m for m in r["machines"] if m["phase"] in ("draining", "switching", "starting")]
                self.most_at_once = max(self.most_at_once, len(busy))
                for m in r["machines"]:
                    seen = self.passed.setdefault(m["id"], [])
                    if m["phase"] and (not seen or seen[-1] != m["phase"]):
                        seen.append(m["phase"])
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)


def MACHINE_IDS(c) -> list[str]:
    return [m["id"] for m in c.call("GET", "/v1/machines")[1]["machines"]]


def rollout_page(c, tmp_path) -> tuple[list[str], list[str]]:
    """The fleet page's profile rollouts view, in Chromium: the rollouts' states, and a row per
    profile version held (version, machines, their phases)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.controlplane.frontend.test_fleet_page import chrome, sign_in

    driver = chrome(tmp_path)
    try:
        sign_in(driver, c.url, API_TOKEN, "rollouts")
        WebDriverWait(driver, 20).until(EC.visibility_of_element_located((By.CSS_SELECTOR, '[data-k="rollout-state"]')))
        states = [e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-k="rollout-state"]')]
        rows = [" ".join(td.text for td in r.find_elements(By.TAG_NAME, "td"))
                for r in driver.find_elements(By.CSS_SELECTOR, '[data-k="rollout-version"]')]
        logs = driver.get_log("browser")
        assert not [e for e in logs if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]], logs
        return states, rows
    finally:
        driver.quit()


def profile_dir(tmp_path, **swappiness: int):
    """controld's profile directory: a profile a name, each setting vm.swappiness."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for name, value in swappiness.items():
        (profiles / f"{name}.toml").write_text(f'[sysctl]\n"vm.swappiness" = {value}\n')
    return profiles


def three_tasks_on_base(c) -> None:
    """Entitlement e (profile base) with job e/api's three tasks running, a machine each."""
    assert c.call("POST", "/v1/entitlements", {"name": "e", "machine_type": "generic", "quota": 3,
                                             "profile": "base"})[0] == 201
    assert c.call("POST", "/v1/jobs", {"entitlement": "e", "name": "api", "count": 3, "task": TASK})[0] == 201
    c.wait_for("/v1/jobs/e/api", lambda j: j["summary"].get("running") == 3, what="3 tasks running")


def rollout(c, name: str, pred, what: str, timeout: float = 60) -> dict:
    return c.wait_for(f"/v1/entitlements/{name}/rollout", pred, timeout=timeout, what=what)


def test_a_profile_change_rolls_out_one_machine_at_a_time_through_taskcontrol(tmp_path, etcd_server, capsys):
    profiles = profile_dir(tmp_path, base=60, web=10)
    ctl = OneAtATime()
    with daemon_with_sim_agents(tmp_path, etcd_server.port, MACHINES, heartbeat_timeout=10.0,
                                extra=("--profiles", str(profiles))) as (c, agents), Background(ctl) as url:
        assert c.call("POST", "/v1/entitlements", {"name": "e", "machine_type": "generic", "quota": 3, "profile": "base",
                                                 "allow_controller_networks": ["127.0.0.0/8"],
                                                 "rollout": {"deadline": 30}})[0] == 201
        status, job = c.call("POST", "/v1/jobs", {"entitlement": "e", "name": "api", "count": 3, "task": TASK,
                                                 "controller": url})
        assert status == 201, job
        c.wait_for("/v1/jobs/e/api", lambda j: j["summary"].get("running") == 3, what="3 tasks running")
        base = rollout(c, "e", lambda r: r["state"] == "done", "the baseline")
        assert base["to"].startswith("base@") and {m["wants"] for m in base["machines"]} == {base["to"]}

        phases = Phases(c, "e")
        url_args = ["--url", c.url, "--token", API_TOKEN]
        assert twinectl.main([*url_args, "entitlement", "modify", "e", "--profile", "web", "--wait", "60"]) == 0
        phases.stop()
        out = capsys.readouterr().out
        r = c.call("GET", "/v1/entitlements/e/rollout")[1]
        assert r["state"] == "done" and r["from"] == base["to"] and r["to"].startswith("web@"), r
        assert phases.most_at_once == 1, "never two machines at once"
        assert all(p == ["pending", "draining", "switching", "starting", "done"] or p[-4:] == ["draining", "switching",
                   "starting", "done"] for p in phases.passed.values()), phases.passed
        assert [len(b["machines"]) for b in r["batches"]] == [1, 1, 1] and all(b["outcome"] == "done" for b in r["batches"])
        web_hash = r["to"].split("@")[1]
        assert {agents.desired_profile[m][0] for m in MACHINES} == {"web"}
        assert all(agents.desired_profile[m][1].startswith(web_hash) for m in MACHINES)
        reprofiles = {(i, m) for kind, reason, i, m in ctl.seen if kind == "reprofile"}
        assert len(reprofiles) == 3 and {reason for kind, reason, *_ in ctl.seen if kind == "reprofile"} == {"reprofile"}
        j = c.call("GET", "/v1/jobs/e/api")[1]
        assert all(t["state"] == "running" for t in j["tasks"])
        assert "done: " in out and "batch 3" in out, out
        events = [e["reason"] for e in c.call("GET", "/v1/events")[1]["events"] if e["kind"] == "rollout"]
        assert any(e.startswith("rollout e-") and "base@" in e and "-> web@" in e for e in events), events
        assert sum(e.startswith("batch ") and " done: " in e for e in events) == 3, events
        assert any(e.startswith("rollout done: the machines hold web@") for e in events), events

        # the file of the profile changes on the control host: a rollout of the new content
        (profiles / "web.toml").write_text('[sysctl]\n"vm.swappiness" = 20\n')
        first = r["id"]
        edited = rollout(c, "e", lambda x: x["id"] != first and x["state"] == "done", "the edited profile rolled out")
        assert edited["from"] == r["to"] and edited["to"] != r["to"], edited
        assert edited["to"].startswith("web@") and len(edited["batches"]) == 3
        assert len({agents.desired_profile[m][1] for m in MACHINES}) == 1


def test_a_profile_the_agents_cannot_apply_is_rolled_back_on_the_first_machine_only(tmp_path, etcd_server):
    profiles = profile_dir(tmp_path, base=60, bad=11)
    with daemon_with_sim_agents(tmp_path, etcd_server.port, MACHINES, heartbeat_timeout=10.0,
                                extra=("--profiles", str(profiles))) as (c, agents):
        agents.profile_errors["bad"] = "sysctl vm.swappiness: Permission denied"
        three_tasks_on_base(c)
        rollout(c, "e", lambda r: r["state"] == "done", "the baseline")
        assert c.call("PATCH", "/v1/entitlements/e", {"profile": "bad"})[0] == 200
        r = rollout(c, "e", lambda r: r["state"] == "rolled_back", "the rollback")
        first = r["batches"][0]
        assert first["outcome"] == "failed" and "the agent could not apply bad" in first["why"], first
        assert "Permission denied" in first["why"]
        assert [b["machines"] for b in r["batches"][1:]] == [first["machines"]] and r["batches"][1]["back"]
        assert {agents.desired_profile[m][0] for m in MACHINES} == {"base"}
        e = c.call("GET", "/v1/entitlements/e")[1]
        assert e["profile"] == "base", "the rollback put the old name back"
        c.wait_for("/v1/jobs/e/api", lambda j: j["summary"].get("running") == 3, what="3 tasks running again")
        time.sleep(2)  # the leader's next passes start no rollout of the rolled-back profile
        assert c.call("GET", "/v1/entitlements/e/rollout")[1]["id"] == r["id"]


def test_an_admin_pauses_resumes_and_rolls_back(tmp_path, etcd_server, capsys):
    profiles = profile_dir(tmp_path, base=60, web=10)
    with daemon_with_sim_agents(tmp_path, etcd_server.port, MACHINES, heartbeat_timeout=10.0,
                                extra=("--profiles", str(profiles))) as (c, agents):
        three_tasks_on_base(c)
        rollout(c, "e", lambda r: r["state"] == "done", "the baseline")
        status, refused = c.call("POST", "/v1/entitlements/e/rollout/resume")
        assert status == 409 and "not paused" in refused["why"], refused
        assert c.call("PATCH", "/v1/entitlements/e", {"profile": "web"})[0] == 200
        rollout(c, "e", lambda r: r["state"] == "rolling" and r["batches"], "the first batch")
        url_args = ["--url", c.url, "--token", API_TOKEN]
        assert twinectl.main([*url_args, "entitlement", "rollout", "pause", "e"]) == 0
        paused = rollout(c, "e", lambda r: r["state"] == "paused" and all(b["outcome"] for b in r["batches"]),
                         "the batch in progress ended")
        time.sleep(2)
        assert len(c.call("GET", "/v1/entitlements/e/rollout")[1]["batches"]) == len(paused["batches"]) == 1
        # the fleet page, in Chromium: the machines by the profile version they hold, mid-rollout
        state, rows = rollout_page(c, tmp_path)
        first = paused["batches"][0]["machines"][0]
        others = ", ".join(sorted(set(MACHINE_IDS(c)) - {first}))
        assert state == ["paused"], state
        assert sorted(rows) == sorted([f"{paused['to']} {first} done", f"{paused['from']} {others} pending, pending"]), rows
        assert twinectl.main([*url_args, "entitlement", "rollout", "resume", "e"]) == 0
        rollout(c, "e", lambda r: len(r["batches"]) >= 2, "a second batch")
        assert twinectl.main([*url_args, "entitlement", "rollout", "rollback", "e"]) == 0
        r = rollout(c, "e", lambda r: r["state"] == "rolled_back", "rolled back")
        assert {agents.desired_profile[m][0] for m in MACHINES} == {"base"}
        capsys.readouterr()
        assert twinectl.main([*url_args, "entitlement", "rollout", "status", "e"]) == 0
        out = capsys.readouterr().out
        assert f"rollout {r['id']} of e: rolled back, base@" in out and "rolled back by an admin" in out, out


def test_a_job_that_asks_for_moves_is_moved_off_each_machine_make_before_break(tmp_path, etcd_server):
    """update.reprofile: move: each task leaves its machine before the machine switches (a move
    its controller acks, cause reprofile), its copy running on a free machine the entitlement
    takes (with the new profile) before the old copy stops: never down. The emptied machines go
    back to the free pool, and leave the rollout."""
    profiles = profile_dir(tmp_path, base=60, web=10)
    ctl = OneAtATime()
    machines = ("m1", "m2", "m3", "m4", "m5", "m6")
    with daemon_with_sim_agents(tmp_path, etcd_server.port, machines, heartbeat_timeout=10.0,
                                extra=("--profiles", str(profiles))) as (c, agents), Background(ctl) as url:
        assert c.call("POST", "/v1/entitlements", {"name": "e", "machine_type": "generic", "quota": 6, "profile": "base",
                                                 "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "e", "name": "api", "count": 3, "task": TASK, "controller": url,
                                           "update": {"reprofile": "move"}})[0] == 201
        job = c.wait_for("/v1/jobs/e/api", lambda j: j["summary"].get("running") == 3, what="3 tasks running")
        before = {t["index"]: t["machine"] for t in job["tasks"]}
        rollout(c, "e", lambda r: r["state"] == "done", "the baseline")
        down: list[dict] = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                j = c.call("GET", "/v1/jobs/e/api")[1]
                if any(t["state"] != "running" for t in j["tasks"]):
                    down.append({t["index"]: t["state"] for t in j["tasks"]})
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            assert c.call("PATCH", "/v1/entitlements/e", {"profile": "web"})[0] == 200
            r = rollout(c, "e", lambda r: r["state"] == "done", "the rollout", timeout=90)
        finally:
            stop.set()
            watcher.join(5)
        after = {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/e/api")[1]["tasks"]}
        assert down == [], "a task was down while it moved"
        moved = {(i, m) for kind, _, i, m in ctl.seen if kind == "move"}
        assert moved == {(i, m) for i, m in before.items()}, ("each task moved once, off its machine", moved, after)
        moves = {(kind, reason) for kind, reason, *_ in ctl.seen}
        assert ("move", "reprofile") in moves and not any(kind == "reprofile" for kind, _ in moves), moves
        held = c.call("GET", "/v1/entitlements/e")[1]["machines"]
        assert sorted(held) == sorted(after.values()), "the emptied machines went back to the free pool"
        assert len(held) == 3, ("still spread over MSBs (a machine, an MSB here)", after)
        assert all(agents.desired_profile[m][0] == "web" for m in held)
        assert r["machines"] == [] or all(m["id"] in held for m in r["machines"]), r
