"""Every answer of a live region holds to the document's answer schema for it (issue #11: one
schema, from which the document is generated). The schemas forbid fields they do not list, so a
view that grows a field the document does not say fails here. Each answer is looked up in the
served document by its path, method and status, and converted into the type that schema was
generated from (controlplane/frontend/schema.py)."""

from __future__ import annotations

import re
import threading
import time

import msgspec

from controlplane.frontend import schema as S
from tests.controlplane.controld_proc import BOOTSTRAP_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import TASK, register


class Answers:
    def __init__(self, c: Controld):
        self.c = c
        status, self.doc = c.call("GET", "/v1/openapi.json", token=None)
        assert status == 200
        self.routes = [(re.compile("^" + re.sub(r"{\w+}", "[^/]+", p) + "$"), p) for p in self.doc["paths"]]
        self.held: set[tuple[str, str, int]] = set()

    def schema_of(self, method: str, path: str, status: int) -> str:
        template = next(p for rx, p in self.routes if rx.match(path.partition("?")[0]))
        answer = self.doc["paths"][template][method.lower()]["responses"][str(status)]
        ref = answer["content"]["application/json"]["schema"]["$ref"]
        self.held.add((method, template, status))
        return ref.rsplit("/", 1)[1]

    def call(self, method: str, path: str, body: object = None, want: int = 200, **kw) -> dict:
        status, answer = self.c.call(method, path, body, **kw)
        assert status == want, (method, path, status, answer)
        name = self.schema_of(method, path, status)
        try:
            converted = msgspec.convert(answer, S.ANSWERS[name], strict=True)
        except msgspec.ValidationError as e:
            raise AssertionError(f"{method} {path} -> {status}: the answer does not hold to {name}: {e}\n{answer}")
        # nothing left out on the way: a nested record that is a dataclass (the discovery's
        # Endpoint) drops a field it does not list, where an Answer refuses it
        assert msgspec.to_builtins(converted) == answer, (method, path, msgspec.to_builtins(converted), answer)
        return answer


def _heartbeats(c: Controld, creds: dict[str, str], stop: threading.Event) -> None:
    while not stop.is_set():
        for cred in creds.values():
            c.call("POST", "/v1/agent/heartbeat", {"digest": "d", "tasks": []}, token=cred)
        stop.wait(0.3)


def test_every_answer_of_a_live_region_holds_to_the_documents_schema(tmp_path, etcd_server):
    # a lease of 10 s: this test is about the answers' shapes, not failover; on a host loaded by the VM
    # region's boot the 2 s lease lapsed and a call met "shard 0 has no leader" (503)
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=2, extra=("--lease-ttl", "10")).start()
    stop = threading.Event()
    try:
        a = Answers(c)
        creds = {m: register(c, m, "dc1", f"msb{m}", cpus=8) for m in ("m1", "m2")}
        beats = threading.Thread(target=_heartbeats, args=(c, creds, stop), daemon=True)
        beats.start()
        reg = {"machine_id": "m3", "labels": {"region": c.region, "dc": "dc1", "msb": "msb3", "rack": "r3",
               "machine_type": "spare"}, "capacity": {"cpus": 2, "memory_mb": 2048, "supports": ["sysctl"]}}
        a.call("POST", "/v1/agent/register", reg, token=BOOTSTRAP_TOKEN)  # m3 is silent from now on: it fails

        a.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2, "owner": "team"},
               want=201)
        a.call("PATCH", "/v1/entitlements/web", {"spread": {"properties": ["dc"]}})
        a.call("GET", "/v1/entitlements")
        a.call("GET", "/v1/entitlements/web")
        a.call("POST", "/v1/entitlements/web/move", {"shard": 0})
        a.call("GET", "/v1/entitlements/web/rollout")
        a.call("POST", "/v1/entitlements/web/rollout/pause", want=409)  # done: nothing to pause
        a.call("POST", "/v1/entitlements/web/rollout/resume", want=409)
        a.call("POST", "/v1/entitlements/web/rollout/rollback", want=409)  # its baseline: nothing came before
        a.call("GET", "/v1/entitlements/web/rollout")
        job = {"entitlement": "web", "name": "api", "count": 2,
               "task": {**TASK, "env": {"A": "1"}, "secret_env": {"S": "s"}},
               "preferences": [{"property": "msb", "strategy": "spread"}], "update": {"max_unavailable": 1}}
        a.call("POST", "/v1/jobs", job, want=201)
        c.wait_for("/v1/jobs/web/api", lambda j: all(t["machine"] for t in j["tasks"]) and len(j["tasks"]) == 2,
                   what="2 tasks placed")
        shown = a.call("GET", "/v1/jobs/web/api")
        assert shown["task"]["secret_env"] == {"S": None} and shown["tasks"][0]["where"]["dc"] == "dc1"
        a.call("GET", "/v1/jobs?entitlement=web")
        a.call("PUT", "/v1/jobs/web/api", {**job, "task": {**job["task"], "secret_env": {"S": None}}})
        a.call("POST", "/v1/jobs/web/api/dry-run", {**job, "task": {**job["task"], "env": {"A": "2"},
                                                                     "secret_env": {"S": None}}})
        a.call("POST", "/v1/jobs/web/api/resize", {"count": 1})
        a.call("GET", "/v1/jobs/web/api/autoscale")  # no policy: what the SRM says of that
        auto = {**job, "name": "auto", "count": 1, "task": TASK,
                "autoscale": {"min": 1, "max": 10_000, "metric": {"target": 5, "http": "http://127.0.0.1:9/load"}}}
        assert a.call("POST", "/v1/jobs", auto, want=201)["warnings"][0].startswith("autoscale.max 10000 is clamped")
        a.call("GET", "/v1/jobs/web/auto/autoscale")
        a.call("GET", "/v1/rebalance/plan")
        a.call("GET", "/v1/rebalance/plan?entitlement=web")
        a.call("POST", "/v1/rebalance/apply?entitlement=web")
        a.call("GET", "/v1/rebalance")
        a.call("POST", "/v1/rebalance/enable", {"entitlement": "web"})
        a.call("POST", "/v1/rebalance/disable", {})
        a.call("POST", "/v1/capacity/pause", {})
        a.call("POST", "/v1/capacity/resume", {})
        a.call("POST", "/v1/capacity/reserve", {"machines": 0})
        a.call("GET", "/v1/capacity")
        a.call("GET", "/v1/capacity/forecast")
        a.call("GET", "/v1/capacity/slo")
        a.call("GET", "/v1/capacity/history?since=7200")
        a.call("DELETE", "/v1/jobs/web/auto", want=202)
        a.call("GET", "/v1/discovery/web/api")
        a.call("GET", "/v1/machines")
        machine = a.call("GET", "/v1/machines/m1")
        assert "desired_version" in machine and "tasks" in machine

        token = a.call("POST", "/v1/tokens", {"role": "owner", "entitlements": ["web"], "expires_in": 60}, want=201)
        a.call("GET", "/v1/tokens")
        a.call("DELETE", f"/v1/tokens/{token['id']}")

        now = time.time()
        m = a.call("POST", "/v1/maintenance", {"machines": ["m2"], "start": now + 3600, "duration": 60}, want=201)
        a.call("POST", "/v1/dry-run/maintenance", {"machines": ["m1"], "start": now + 3600, "duration": 60})
        a.call("GET", "/v1/maintenance?all=1")
        a.call("GET", f"/v1/maintenance/{m['id']}")
        a.call("POST", f"/v1/maintenance/{m['id']}/end")

        on = c.wait_for("/v1/jobs/web/api", lambda j: j["tasks"][0]["state"] == "starting", what="a task starting")
        cred = creds[on["tasks"][0]["machine"]]
        desired = a.call("GET", "/v1/agent/desired?wait=0", token=cred)
        assert desired["tasks"] and desired["tasks"][0]["env"] == {"A": "1", "S": "s"}, desired
        a.call("POST", "/v1/agent/heartbeat", {"digest": "other"}, token=cred)  # resend
        usage = {"window": 1.0, "cpus": 2, "cpu": 0.5, "memory_mb": 500.0, "memory_total_mb": 2048.0,
                 "tasks": [["web/api", on["tasks"][0]["index"], 0.25, 20.0]]}
        a.call("POST", "/v1/agent/heartbeat", {"digest": "other", "usage": usage}, token=cred)
        a.call("POST", "/v1/internal/relay", {"from": "elsewhere", "usage": {"jobs": {"web/api": [10, 1, 1]},
                                              "cells": [["dc1", "msb1", "web", "", "generic", 10, 1, 20, 2, 0, 1, 0]]}})
        fleet = a.call("GET", "/v1/fleet")
        assert sum(c["used"]["cpus"] for c in fleet["cells"]) == 0.26, fleet["cells"]
        a.call("GET", "/v1/fleet?by=entitlement,type")
        assert a.call("GET", "/v1/jobs/web/api/usage?since=86400&step=3600")["current"]["cpus"] == 0.26
        # heard from again: the book forgets a machine silent for 3 heartbeat intervals and 1 s, and
        # this machine speaks only when the test does (on a loaded host the calls above took longer)
        a.call("POST", "/v1/agent/heartbeat", {"digest": "other", "usage": usage}, token=cred)
        per_task = a.call("GET", "/v1/jobs/web/api/usage?tasks=1")["tasks"]
        assert [t["cpus"] for t in per_task if t["index"] == on["tasks"][0]["index"]] == [0.25], per_task
        assert len(a.call("GET", "/v1/internal/usage/tasks?entitlement=web")["tasks"]) == 1
        a.call("GET", "/v1/entitlements/web/usage?since=1209600")
        a.call("GET", "/v1/jobs/web/api/usage?step=7", want=400)
        a.call("POST", "/v1/internal/relay", {"from": "elsewhere", "seen": ["m1"], "reports": {}})
        a.call("GET", "/v1/cluster")
        a.call("GET", "/healthz", token=None)

        c.wait_for("/v1/events", lambda e: any(ev["kind"] == "failure" for ev in e["events"]), what="m3 failed")
        a.call("GET", "/v1/events")
        a.call("POST", "/v1/machines/m3/clean")
        a.call("POST", "/v1/machines/m3/release")
        a.call("POST", "/v1/agent/shutdown", {"reason": "reboot"}, token=creds["m2"])
        a.call("DELETE", "/v1/jobs/web/api", want=202)

        for method, path, body, want in (("GET", "/v1/jobs/web/none", None, 404), ("POST", "/v1/jobs", {}, 400),
                                         ("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic",
                                                                       "quota": 1}, 409),
                                         ("POST", "/v1/jobs/web/api/resize", {"count": 5}, 409)):
            a.call(method, path, body, want=want)
        a.call("GET", "/v1/jobs", token="wrong", want=401)

        answered = {(m, p) for m, p, _ in a.held}
        every = {(m.upper(), p) for p, ops in a.doc["paths"].items() for m in ops}
        untyped = {("GET", "/v1/openapi.json"), ("GET", "/v1/metrics")}  # the document; Prometheus text
        assert every - untyped - answered == set(), "an operation this test does not call"
    finally:
        stop.set()
        c.close()
