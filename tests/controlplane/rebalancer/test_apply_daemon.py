"""A ReBalancer round that moves tasks, against a real twine-controld on real etcd with simulated
agents (named so: no containers; tests/controlplane/simagents.py): the plan's moves are carried out
by the job's shard leader make-before-break (the copy runs on the target while the task still runs
where it was), a machine emptied goes back to the free pool, each move is an event; a job's
TaskController that refuses a move is not asked again, and the next round proposes another task,
which it approves; the continuous mode is off until an admin enables it."""

from __future__ import annotations

import threading
import time

from controlplane.cli import twinectl
from tests.controlplane.controld_proc import API_TOKEN, Controld, wait
from tests.controlplane.frontend.test_controld_api import register
from tests.controlplane.simagents import SimAgents
from tests.controlplane.srm.test_srm_daemon import Endpoint

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "memory_mb": 64}


def half_empty(c, ent: str, job: str, **spec) -> dict[int, str]:
    """Two machines of `ent` each 0.8 of 2 cores full with a task of `job` (a job of 1.2-core
    tasks, one a machine, made them take a machine each; it is stopped)."""
    assert c.call("POST", "/v1/jobs", {"entitlement": ent, "name": "big", "count": 2,
                                       "task": {**TASK, "cpus": 1.2}})[0] == 201
    c.wait_for(f"/v1/jobs/{ent}/big", lambda j: j["summary"].get("running") == 2, what="big running")
    status, body = c.call("POST", "/v1/jobs", {"entitlement": ent, "name": job, "count": 2,
                                               "task": {**TASK, "cpus": 0.8}, **spec})
    assert status == 201, body
    c.wait_for(f"/v1/jobs/{ent}/{job}", lambda j: j["summary"].get("running") == 2, what=f"{job} running")
    c.call("DELETE", f"/v1/jobs/{ent}/big")
    c.wait_for(f"/v1/jobs/{ent}/big", lambda j: j["state"] == "stopped", what="big stopped")
    where = {t["index"]: t["machine"] for t in c.call("GET", f"/v1/jobs/{ent}/{job}")[1]["tasks"]}
    assert len(set(where.values())) == 2, where
    return where


class Watch:
    """Samples, every 20 ms, whether every task of the job runs (the API's view), until stopped;
    and which of its tasks ran on two machines at once meanwhile (the agents note it as their
    state changes: a sample every GET, on a loaded host a second or more apart, could miss it)."""

    def __init__(self, c, agents: SimAgents, handle: str):
        self.c, self.agents, self.handle = c, agents, handle
        self.down: list[dict] = []
        self._before = set(agents.overlapped)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @property
    def both(self) -> set[int]:
        """The job's tasks seen running on two machines at once since the watch began."""
        return {i for (job, i) in self.agents.overlapped - self._before if job == self.handle}

    def _run(self) -> None:
        while not self._stop.is_set():
            status, j = self.c.call("GET", f"/v1/jobs/{self.handle}")
            if status == 200 and any(t["state"] != "running" for t in j["tasks"]):
                self.down.append({t["index"]: t["state"] for t in j["tasks"]})
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)


def test_a_round_moves_a_task_make_before_break_and_frees_its_machine(tmp_path, etcd_server, capsys):
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0).start()
    try:
        creds = {m: register(c, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url], interval=0.2) as agents:
            assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 3})[0] == 201
            where = half_empty(c, "web", "small")
            status, st = c.call("GET", "/v1/rebalance")
            assert status == 200 and st["continuous"] == {"all": False, "entitlements": []}, st

            agents.stop_delay = 1.0  # a container takes a moment to stop: the overlap is plain to see
            watch = Watch(c, agents, "web/small")
            try:
                rc = twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "apply", "--entitlement",
                                    "web", "--wait", "60"])
                text = capsys.readouterr().out
            finally:
                watch.stop()
            assert rc == 0, text
            assert "requested in round round-" in text and "1 of 1 move(s) ended (1 done)" in text, text
            (mv,) = [line for line in text.splitlines() if line.startswith("web/small#")]
            index = int(mv.split()[0].split("#")[1])
            source, target = mv.split()[1], mv.split()[2]
            assert where[index] == source and target == where[1 - index], (mv, where)

            after = {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/small")[1]["tasks"]}
            assert after == {0: target, 1: target}, after
            assert watch.down == [], f"a task was not running while it moved: {watch.down[:3]}"
            assert index in watch.both, "the copy ran on the target while the task still ran on the source"
            wait(lambda: c.call("GET", f"/v1/machines/{source}")[1]["entitlement"] is None, 10,
                 f"{source} back in the free pool")
            assert agents.running[source] == {}, agents.running
            # discovery points at the target
            (ep,) = [e for e in c.call("GET", "/v1/discovery/web/small")[1]["endpoints"] if e["index"] == index]
            assert ep["machine"] == target and ep["enabled"], ep
            # the move is an event, with its goal; the status says how it ended
            events = [e for e in c.call("GET", "/v1/events")[1]["events"] if e["kind"] == "rebalance"]
            assert len(events) == 1 and f"web/small#{index} from {source} to {target}: done (compaction" in \
                events[0]["reason"], events
            st = c.call("GET", "/v1/rebalance")[1]
            assert st["moving"] == [] and st["requested"] == 0 and st["recent"][0]["outcome"] == "done", st
            # the next round has nothing to do: the task cools down, and nothing is left to free
            p = c.call("GET", "/v1/rebalance/plan?entitlement=web")[1]
            assert p["moves"] == [] and p["goals"]["compaction"]["machines_held"] == {"before": 1, "after": 1}, p
            # and the fleet page shows the move (Debian's Chromium)
            rows = page_rows(c, tmp_path, "moved")
            assert any(f"web/small#{index}" in r and target in r and "done" in r for r in rows), rows
            # a job stopped: the next round removes its rebalance record
            c.call("DELETE", "/v1/jobs/web/small")
            c.wait_for("/v1/jobs/web/small", lambda j: j["state"] == "stopped", what="small stopped")
            assert c.call("POST", "/v1/rebalance/apply")[0] == 200
            assert c.call("GET", "/v1/rebalance")[1]["recent"] == []
    finally:
        c.close()


def page_rows(c, tmp_path, k: str) -> list[str]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.controlplane.frontend.test_fleet_page import chrome, sign_in

    driver = chrome(tmp_path)
    try:
        sign_in(driver, c.url, API_TOKEN, "rebalance")
        WebDriverWait(driver, 20).until(EC.visibility_of_element_located((By.CSS_SELECTOR, '[data-k="rebalance-mode"]')))
        rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, f'[data-k="{k}"]')]
        logs = driver.get_log("browser")
        assert not [e for e in logs if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]], logs
        return rows
    finally:
        driver.quit()


def test_a_refused_move_is_not_asked_again_and_another_task_moves_instead(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0).start()
    ep = Endpoint()
    refused: list[str] = []

    def controller(req):
        acks = []
        for op in req["request"]:
            if op["kind"] == "move" and op["reason"] == "rebalance" and (not refused or op["id"] in refused):
                if op["id"] not in refused:
                    refused.append(op["id"])  # the first move it is asked for, it never acks
                continue
            acks.append(op["id"])
        return {"ack": acks}

    ep.on_post = controller
    try:
        creds = {m: register(c, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url], interval=0.2):
            assert c.call("POST", "/v1/entitlements", {"name": "ctl", "machine_type": "generic", "quota": 3,
                                                       "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
            half_empty(c, "ctl", "api", controller=ep.url)
            status, r1 = c.call("POST", "/v1/rebalance/apply?entitlement=ctl")
            assert status == 200 and r1["requested"] == 1, r1
            first = r1["moves"][0]
            st = wait(lambda: (s := c.call("GET", "/v1/rebalance")[1])["recent"] and
                      s["recent"][0]["outcome"].startswith("dropped") and s, 30, "the refused move dropped")
            assert "refused by the job's TaskController" in st["recent"][0]["outcome"], st
            assert refused == [f"move/{first['index']}/rebalance/{first['target']}"], refused
            # not asked again: no call after the drop carries it
            calls = len(ep.calls)
            time.sleep(3)
            assert not any(op["id"] == refused[0] for req in ep.calls[calls:] for op in req["request"]), ep.calls[calls:]
            # the next round leaves the refused task alone (it cools down) and moves the other one
            status, r2 = c.call("POST", "/v1/rebalance/apply?entitlement=ctl")
            assert status == 200 and r2["requested"] == 1 and r2["moves"][0]["index"] != first["index"], r2
            second = r2["moves"][0]
            wait(lambda: {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/ctl/api")[1]["tasks"]}
                 [second["index"]] == second["target"], 30, "the approved move done")
            done = [x for req in ep.calls for x in req.get("completed", []) if x["kind"] == "move"]
            wait(lambda: [x for req in ep.calls for x in req.get("completed", []) if x["kind"] == "move"], 10,
                 "the controller told the move completed")
            done = [x for req in ep.calls for x in req.get("completed", []) if x["kind"] == "move"]
            assert done[0]["outcome"] == "done" and done[0]["task"]["index"] == second["index"], done
    finally:
        ep.close()
        c.close()


def test_the_continuous_mode_is_off_until_an_admin_enables_it(tmp_path, etcd_server, capsys):
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0, extra=("--rebalance-interval", "1")).start()
    try:
        creds = {m: register(c, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url], interval=0.2):
            assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 3})[0] == 201
            assert c.call("POST", "/v1/entitlements", {"name": "other", "machine_type": "generic", "quota": 1})[0] == 201
            where = half_empty(c, "web", "small")
            time.sleep(3)  # three rounds' time: off, nothing moves
            assert {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/small")[1]["tasks"]} == where
            status, body = c.call("POST", "/v1/rebalance/enable", {"entitlement": "nope"})
            assert status == 404 and body["field"] == "entitlement", body
            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "enable", "--entitlement",
                                  "other"]) == 0
            assert capsys.readouterr().out.startswith("continuous mode: on for other")
            time.sleep(3)  # on for another entitlement only: web's tasks stay
            assert {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/small")[1]["tasks"]} == where
            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "enable"]) == 0
            assert capsys.readouterr().out.startswith("continuous mode: on for every entitlement")
            wait(lambda: len({t["machine"] for t in c.call("GET", "/v1/jobs/web/small")[1]["tasks"]}) == 1, 30,
                 "the continuous mode compacts web")
            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "status"]) == 0
            text = capsys.readouterr().out
            assert "continuous mode: on for every entitlement" in text and "done" in text, text
            assert twinectl.main(["--url", c.url, "--token", API_TOKEN, "rebalance", "disable"]) == 0
            assert capsys.readouterr().out.startswith("continuous mode: off")
    finally:
        c.close()


def test_a_move_in_progress_survives_a_change_of_leader(tmp_path, etcd_server):
    """The move is in etcd (the task's `moving`), not in the leader's memory: the shard leader is
    killed while the copy has not started yet (the agents read no desired state meanwhile); the
    new leader finishes the move, and no copy of any task is started twice on one machine."""
    import signal

    from tests.controlplane.controld_proc import member
    from tests.controlplane.coordination.test_replicas_chaos import leader_of, replicas

    cs = replicas(tmp_path, etcd_server.port, 2)
    try:
        for c in cs:
            c.start()
        first = cs[0]
        creds = {m: register(first, m, "dc1", "msb1", cpus=2, memory_mb=4096) for m in ("m1", "m2", "m3")}
        with SimAgents(creds, [c.url for c in cs], interval=0.2) as agents:
            assert first.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic",
                                                           "quota": 3})[0] == 201
            half_empty(first, "web", "small")
            agents.poll = False  # heartbeats go on; no agent reads its desired state: the copy waits
            status, r = first.call("POST", "/v1/rebalance/apply?entitlement=web")
            assert status == 200 and r["requested"] == 1, r
            mv = r["moves"][0]

            def moving(c):
                ts = c.call("GET", "/v1/jobs/web/small")[1]["tasks"]
                return any(t.get("moving", {}).get("machine") == mv["target"] for t in ts)

            wait(lambda: moving(first), 20, "the move begun")
            leader_id = leader_of(first)
            leader = next(c for c in cs if member(c) == leader_id)
            (other,) = [c for c in cs if c is not leader]
            leader.kill(signal.SIGKILL)
            wait(lambda: leader_of(other) not in (None, leader_id), 20, "a new leader")
            assert moving(other), "the move is still in progress: the new leader read it from etcd"
            st = other.call("GET", "/v1/rebalance")[1]
            assert [(m["index"], m["source"], m["target"]) for m in st["moving"]] == \
                [(mv["index"], mv["source"], mv["target"])], st
            agents.poll = True
            wait(lambda: {t["index"]: t["machine"] for t in other.call("GET", "/v1/jobs/web/small")[1]["tasks"]}
                 [mv["index"]] == mv["target"], 30, "the new leader finished the move")
            st = other.call("GET", "/v1/rebalance")[1]
            assert st["recent"][0]["outcome"] == "done" and st["moving"] == [], st
            assert all(t["state"] == "running" for t in other.call("GET", "/v1/jobs/web/small")[1]["tasks"])
            assert agents.restarts()["started_again"] == {}, agents.restarts()
    finally:
        for c in cs:
            c.close()


def test_a_swap_takes_a_free_machine_and_gives_one_back_a_whole_rack_freed(tmp_path, etcd_server):
    """Racks r1 = {m1, m3} and r2 = {m2, m4}; a job's two tasks (1.2 of 2 cores each) take m1 and m2
    (the allocator's best fit, then the ids): no rack is wholly free. The round swaps m1 for m4:
    the task moves make-before-break onto m4, which the entitlement takes, and m1 goes back to the
    pool: rack r1 is wholly free."""
    from tests.controlplane.controld_proc import BOOTSTRAP_TOKEN

    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=5.0).start()
    try:
        creds = {}
        for mid, rack in (("m1", "r1"), ("m2", "r2"), ("m3", "r1"), ("m4", "r2")):
            status, body = c.call("POST", "/v1/agent/register", {
                "machine_id": mid, "hostname": mid, "address": "10.0.0.1",
                "labels": {"region": c.region, "dc": "dc1", "msb": "msb1", "rack": rack, "machine_type": "generic"},
                "capacity": {"cpus": 2, "memory_mb": 4096}}, token=BOOTSTRAP_TOKEN)
            assert status == 200, body
            creds[mid] = body["credential"]
        with SimAgents(creds, [c.url], interval=0.2) as agents:
            assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 3})[0] == 201
            assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2,
                                               "task": {**TASK, "cpus": 1.2}})[0] == 201
            c.wait_for("/v1/jobs/web/api", lambda j: j["summary"].get("running") == 2, what="api running")
            where = {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]}
            assert sorted(where.values()) == ["m1", "m2"], where
            p = c.call("GET", "/v1/rebalance/plan?entitlement=web")[1]
            (mv,) = p["moves"]
            assert (mv["source"], mv["target"], mv["goal"]) == ("m1", "m4", "swaps"), p["moves"]
            assert p["taken"] == {"m4": "web"} and p["goals"]["swaps"]["free_racks"] == {"before": 0, "after": 1}, p
            agents.stop_delay = 1.0
            watch = Watch(c, agents, "web/api")
            try:
                status, r = c.call("POST", "/v1/rebalance/apply?entitlement=web")
                assert status == 200 and r["requested"] == 1, r
                wait(lambda: {t["index"]: t["machine"] for t in c.call("GET", "/v1/jobs/web/api")[1]["tasks"]}
                     [mv["index"]] == "m4", 30, "the task on m4")
            finally:
                watch.stop()
            machines = {m["id"]: m["entitlement"] for m in c.call("GET", "/v1/machines")[1]["machines"]}
            wait(lambda: {m["id"]: m["entitlement"] for m in c.call("GET", "/v1/machines")[1]["machines"]} ==
                 {"m1": None, "m2": "web", "m3": None, "m4": "web"}, 10, f"m1 back in the pool: {machines}")
            assert watch.down == [] and mv["index"] in watch.both, (watch.down[:3], watch.both)
            assert c.call("GET", "/v1/rebalance")[1]["recent"][0]["outcome"] == "done"
    finally:
        c.close()
