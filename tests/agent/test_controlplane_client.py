"""The agent against the control-plane contract of docs/api.md ("Agents"), with a real
twine-controld process (tests/controlplane/controld_proc.py: on the session's etcd, in a region of
its own): registration and the stored credential, the long poll, heartbeats with their digests
and resends, and a real agent process running the daemon's task across the daemon's absence.

`FaultServer`, below, stands in for the daemon only where the real one cannot be made to
misbehave: a desired state the agent must refuse, and a credential refused right after it was
issued.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from agent.config import AgentConfig, Labels
from agent.controlplane_client import ControlPlaneClient, ControlPlaneError, ControlPlaneSource, Unauthorized
from agent.models import DesiredState, TaskSpec
from agent.report import machine_info, report_digest, task_reports
from agent.runtime.base import ContainerInfo, task_labels
from tests.agent.agentproc import REPO, free_port
from tests.conftest import TEST_IMAGE
from tests.controlplane.controld_proc import BOOTSTRAP_TOKEN, Controld

BOOTSTRAP = BOOTSTRAP_TOKEN
TASK = {"job": "web/front", "index": 0, "spec_version": 1, "image": TEST_IMAGE, "command": ["sleep", "300"], "cpus": 0.25, "memory_mb": 32}
JOB_TASK = {"image": TEST_IMAGE, "command": ["sleep", "300"], "cpus": 0.25, "memory_mb": 32}


@pytest.fixture
def controld(tmp_path, etcd_server):
    """A real twine-controld (heartbeat interval 0.5 s, answered to the agents)."""
    (tmp_path / "controld").mkdir()
    c = Controld(tmp_path / "controld", etcd_server.port, extra=("--heartbeat-interval", "0.5")).start()
    try:
        yield c
    finally:
        c.close()


def restart(c: Controld) -> Controld:
    """The same daemon stopped and started again on its port (its memory gone: digests, reports)."""
    c.close()
    return c.start()


def submit(c: Controld, count: int = 1, name: str = "api") -> None:
    if c.call("GET", "/v1/entitlements/web")[0] == 404:
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 4})[0] == 201
    status, body = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": name, "count": count, "task": JOB_TASK})
    assert status == 201, body


class FaultServer:
    """A stand-in for twine-controld's agent endpoints (register, desired, heartbeat), for the faults
    the real daemon does not commit: any desired state (an invalid one too), credentials refused at
    will."""

    def __init__(self) -> None:
        self.url = ""
        self.registrations: list[dict] = []
        self.presented: list[str | None] = []  # the X-Twine-Credential each registration showed
        self.credentials: dict[str, str] = {}  # credential -> machine id
        self.desired = {"version": "v1", "profile": None, "tasks": []}
        self.heartbeats: list[dict] = []
        self.accepted: dict[str, str] = {}  # machine id -> digest of the last full report
        self.refuse_credentials = False
        self.heartbeat_to: object = None  # sent in heartbeat answers when set (the health-checking replica)
        self.pace: dict = {}  # sent in heartbeat answers: {"interval": s, "timeout": s}
        self.hang = False  # heartbeats are taken and never answered (a replica stuck, or cut off)
        self.hung = 0  # heartbeats left unanswered
        self._changed = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/agent/register", self._register)
        app.router.add_get("/v1/agent/desired", self._desired)
        app.router.add_post("/v1/agent/heartbeat", self._heartbeat)
        return app

    def set_desired(self, version: str, tasks: list[dict], profile: str | None = None) -> None:
        self.desired = {"version": version, "profile": profile, "tasks": tasks}
        self._changed.set()
        self._changed = asyncio.Event()

    def revoke(self) -> None:
        self.credentials.clear()

    @staticmethod
    def _error(status: int, kind: str, field: str | None, why: str) -> web.Response:
        return web.json_response({"error": kind, "field": field, "why": why}, status=status)

    @staticmethod
    def _token(request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else ""

    def _machine(self, request: web.Request) -> str | None:
        return None if self.refuse_credentials else self.credentials.get(self._token(request))

    async def _register(self, request: web.Request) -> web.Response:
        if self._token(request) != BOOTSTRAP:
            return self._error(401, "unauthorized", None, "not the bootstrap token")
        body = await request.json()
        for key in ("machine_id", "hostname", "labels", "capacity", "address", "version"):
            if key not in body:
                return self._error(400, "invalid", key, "missing")
        self.registrations.append(body)
        self.presented.append(request.headers.get("X-Twine-Credential"))
        for old in [c for c, m in self.credentials.items() if m == body["machine_id"]]:
            del self.credentials[old]
        credential = secrets.token_hex(16)
        self.credentials[credential] = body["machine_id"]
        return web.json_response({"machine_id": body["machine_id"], "credential": credential})

    async def _desired(self, request: web.Request) -> web.Response:
        if self._machine(request) is None:
            return self._error(401, "unauthorized", None, "unknown credential")
        wait = min(float(request.query.get("wait", "0")), 60)
        if request.query.get("version") == self.desired["version"]:
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                pass
        return web.json_response(self.desired)

    async def _heartbeat(self, request: web.Request) -> web.Response:
        if self.hang:
            self.hung += 1
            await asyncio.Event().wait()
        machine = self._machine(request)
        if machine is None:
            return self._error(401, "unauthorized", None, "unknown credential")
        body = await request.json()
        for key in ("machine_id", "seq", "desired_version", "health", "profile", "digest"):
            if key not in body:
                return self._error(400, "invalid", key, "missing")
        if body["machine_id"] != machine:
            return self._error(400, "invalid", "machine_id", "not the credential's machine")
        self.heartbeats.append(body)
        if "tasks" not in body and self.accepted.get(machine) != body["digest"]:
            self.accepted.pop(machine, None)
            return web.json_response({"ok": True, "resend": True})
        self.accepted[machine] = body["digest"]
        hint = {"heartbeat_to": self.heartbeat_to} if self.heartbeat_to is not None else {}
        return web.json_response({"ok": True, **self.pace, **hint})


@asynccontextmanager
async def serving(server: FaultServer, port: int = 0) -> AsyncIterator[FaultServer]:
    runner = web.AppRunner(server.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


def client_for(url, state_dir: Path, machine: str = "m1", region: str = "region1", **config) -> ControlPlaneClient:
    config.setdefault("labels", Labels(region=region))
    cfg = AgentConfig(machine_id=machine, state_dir=state_dir, **config)
    return ControlPlaneClient(url, BOOTSTRAP, state_dir, machine_info(cfg))


async def until(predicate: Callable[[], object], timeout: float = 2.0, what: str = "condition",
                blocking: bool = False) -> None:
    """Poll predicate(); `blocking`: it makes a call (to the daemon), run off the event loop."""
    deadline = time.monotonic() + timeout
    while not (await asyncio.to_thread(predicate) if blocking else predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05 if blocking else 0.01)


REPORT = {
    "desired_version": "v1",
    "health": {"ok": True, "problems": []},
    "profile": {"name": None, "ok": True, "error": ""},
    "tasks": [{"job": "web/front", "index": 0, "spec_version": 1, "state": "running", "exit_code": None, "restarts": 1, "error": ""}],
}


# -- registration ----------------------------------------------------------------------------


def test_registration_stores_a_private_credential_and_reuses_it_after_restart(tmp_path, controld):
    async def scenario():
        client = client_for(controld.url, tmp_path, region=controld.region, cpus=1.5, memory_mb=256)
        await client.desired("")
        await client.close()
        assert controld.metric("twine_agents_registrations_total") == 1
        status, m = controld.call("GET", "/v1/machines/m1")
        assert status == 200 and m["labels"]["dc"] == "dc1" and m["labels"]["region"] == controld.region
        cap = m["capacity"]
        assert cap["cpus"] == 1.5 and cap["memory_mb"] == 256 and cap["disk_gb"] > 0
        assert cap["cgroup_version"] in (1, 2) and "sysctl" in cap["supports"]
        assert all(isinstance(kb, int) for kb in cap["hugepage_sizes_kb"])
        path = tmp_path / "credential"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text())["credential"] == client.credential

        restarted = client_for(controld.url, tmp_path, region=controld.region)
        assert restarted.credential == client.credential
        await restarted.desired("")
        await restarted.close()
        assert controld.metric("twine_agents_registrations_total") == 1 and restarted.status()["registered"]

    asyncio.run(scenario())


def test_a_released_credential_registers_again_once_with_the_bootstrap_token(tmp_path, controld):
    async def scenario():
        client = client_for(controld.url, tmp_path, region=controld.region)
        await client.desired("")
        first = client.credential
        assert controld.call("POST", "/v1/machines/m1/release")[0] == 200  # an admin's release: the credential is void
        await client.desired("")  # refused, registered again (the machine was released), asked again
        assert controld.metric("twine_agents_registrations_total") == 2 and client.credential != first
        assert json.loads((tmp_path / "credential").read_text())["credential"] == client.credential
        # a bootstrap token alone does not take a registered machine over: the new credential is needed
        other = client_for(controld.url, tmp_path / "other", region=controld.region)
        with pytest.raises(ControlPlaneError, match="409 exists .*is registered"):
            await other.desired("")
        await other.close()
        await client.desired("")
        assert controld.metric("twine_agents_registrations_total") == 2
        await client.close()

    asyncio.run(scenario())


def test_a_credential_refused_again_after_registering_is_given_up_for_this_call(tmp_path):
    """The real daemon never refuses a credential it has just issued: a stand-in does."""
    async def scenario():
        async with serving(FaultServer()) as server:
            client = client_for(server.url, tmp_path)
            await client.desired("")
            first = client.credential
            server.revoke()
            await client.desired("")
            # the first registration had no credential to show; the second showed the one it held
            assert server.presented == [None, first] and client.credential != first
            server.refuse_credentials = True  # a new credential is refused too: give up this call
            with pytest.raises(Unauthorized):
                await client.desired("")
            assert len(server.registrations) == 3
            assert client.status()["error"].startswith("control plane: ")
            await client.close()

    asyncio.run(scenario())


def test_a_wrong_bootstrap_token_is_reported_not_raised_from_the_loops(tmp_path, controld):
    async def scenario():
        info = machine_info(AgentConfig(machine_id="m1", state_dir=tmp_path, labels=Labels(region=controld.region)))
        client = ControlPlaneClient(controld.url, "wrong", tmp_path, info)
        errors: list[str] = []
        watch = asyncio.create_task(ControlPlaneSource(client, "", wait=1).watch(_never, errors.append))
        beat = asyncio.create_task(client.heartbeat_loop(lambda: REPORT))
        await until(lambda: errors, timeout=5, what="an error")
        assert "registration refused" in errors[0] and not (tmp_path / "credential").exists()
        assert not watch.done() and not beat.done()
        assert controld.call("GET", "/v1/machines/m1")[0] == 404
        watch.cancel(), beat.cancel()
        await client.close()

    asyncio.run(scenario())


async def _never(desired: DesiredState) -> None:
    raise AssertionError(f"unexpected desired state {desired}")


# -- desired state ---------------------------------------------------------------------------


def test_long_poll_delivers_the_daemons_changes_of_desired_state(tmp_path, controld):
    async def scenario():
        client = client_for(controld.url, tmp_path, region=controld.region, cpus=2, memory_mb=1024)
        current = (await client.desired(""))["version"]
        source = ControlPlaneSource(client, current, wait=30)  # the agent's cached version; a long wait
        changes: list[DesiredState] = []
        errors: list[str] = []

        async def on_change(d: DesiredState) -> None:
            changes.append(d)

        watch = asyncio.create_task(source.watch(on_change, errors.append))
        await until(lambda: controld.metric("twine_agents_long_polls_total") >= 2, timeout=5, what="the poll parked",
                    blocking=True)
        assert changes == [] and errors == []  # the version it already has: nothing changes

        await asyncio.to_thread(submit, controld)
        t0 = time.monotonic()
        await until(lambda: changes, timeout=10, what="the job's task")
        # the parked poll was answered by the change, not by its 30 s wait running out
        assert time.monotonic() - t0 < 10 and changes[0].source == controld.url
        (task,) = changes[0].tasks
        assert task.job == "web/api" and task.index == 0 and task.image == TEST_IMAGE and task.command == ("sleep", "300")

        assert (await asyncio.to_thread(controld.call, "DELETE", "/v1/jobs/web/api"))[0] == 202
        await until(lambda: len(changes) == 2, timeout=10, what="the stop")
        assert changes[1].tasks == () and changes[1].version != changes[0].version and errors == []
        watch.cancel()
        await client.close()

    asyncio.run(scenario())


def test_a_desired_state_the_agent_cannot_run_goes_to_on_error_and_changes_nothing(tmp_path):
    """The real daemon sends only specs it validated; the agent checks them again: a stand-in sends a bad one."""
    async def scenario():
        async with serving(FaultServer()) as server:
            client = client_for(server.url, tmp_path)
            changes: list[DesiredState] = []
            errors: list[str] = []

            async def on_change(d: DesiredState) -> None:
                changes.append(d)

            watch = asyncio.create_task(ControlPlaneSource(client, "v1", wait=2).watch(on_change, errors.append))
            server.set_desired("v3", [{**TASK, "memory_mb": 1}])
            await until(lambda: errors, what="the rejection")
            assert "tasks[0].memory_mb" in errors[0] and changes == []
            server.set_desired("v4", [TASK])
            await until(lambda: changes, what="v4")
            assert changes[0].version == "v4" and changes[0].tasks == (TaskSpec.from_json(TASK, "", "t"),)
            watch.cancel()
            await client.close()

    asyncio.run(scenario())


def test_an_unreachable_daemon_reports_an_error_changes_nothing_and_recovers(tmp_path, etcd_server):
    async def scenario(c: Controld):
        client = client_for(c.url, tmp_path, region=c.region)
        changes: list[DesiredState] = []
        errors: list[str] = []

        async def on_change(d: DesiredState) -> None:
            changes.append(d)

        watch = asyncio.create_task(ControlPlaneSource(client, "v1", wait=2).watch(on_change, errors.append))
        beat = asyncio.create_task(client.heartbeat_loop(lambda: REPORT))
        await until(lambda: len(errors) >= 2, what="two failed polls")
        assert errors[0].startswith("control plane unreachable: ") and changes == []
        assert len(errors) <= 4  # backing off, not spinning
        assert not watch.done() and not beat.done()
        assert client.status() == {"url": client.url, "urls": [client.url], "heartbeat_to": None, "registered": False,
                                   "last_heartbeat_ok": False, "error": errors[-1]}

        await asyncio.to_thread(c.start)  # the daemon comes up on the address the agent has
        await until(lambda: changes, timeout=10, what="the daemon to be back")
        await until(lambda: client.status()["last_heartbeat_ok"], timeout=10, what="last_heartbeat_ok")
        assert errors[-1] == "" and changes[0].tasks == ()  # the error is cleared; the machine has nothing yet
        assert client.status()["error"] == "" and client.status()["registered"]
        assert c.call("GET", "/v1/machines/m1")[1]["healthy"]
        watch.cancel(), beat.cancel()
        await client.close()

    (tmp_path / "controld").mkdir()
    c = Controld(tmp_path / "controld", etcd_server.port)
    try:
        asyncio.run(scenario(c))
    finally:
        c.close()


# -- heartbeats ------------------------------------------------------------------------------


def test_heartbeat_sends_tasks_once_then_only_the_digest_and_resends_when_asked(tmp_path, controld):
    async def scenario():
        client = client_for(controld.url, tmp_path, region=controld.region)
        for _ in range(2):
            await client.heartbeat(REPORT)
        # the first carried the tasks, the second only their digest, accepted
        assert (controld.metric("twine_agents_heartbeats_total"), controld.metric("twine_agents_heartbeat_reports_total")) == (2, 1)
        assert client.interval == 0.5  # the daemon's --heartbeat-interval

        await asyncio.to_thread(restart, controld)  # a restarted daemon has no report: it asks for one
        await client.heartbeat(REPORT)  # the digest only: answered with resend
        assert controld.metric("twine_agents_heartbeat_reports_total") == 0
        await client.heartbeat(REPORT)
        assert (controld.metric("twine_agents_heartbeats_total"), controld.metric("twine_agents_heartbeat_reports_total")) == (2, 1)

        changed = {**REPORT, "tasks": [{**REPORT["tasks"][0], "state": "exited", "exit_code": 3}]}
        await client.heartbeat(changed)  # a new digest: the tasks go with it
        assert controld.metric("twine_agents_heartbeat_reports_total") == 2
        await client.close()

    asyncio.run(scenario())


def test_heartbeat_loop_sends_at_once_when_notified_and_after_a_resend(tmp_path, etcd_server):
    (tmp_path / "controld").mkdir()
    c = Controld(tmp_path / "controld", etcd_server.port, heartbeat_timeout=120, extra=("--heartbeat-interval", "30"))

    async def scenario():
        client = client_for(c.url, tmp_path, region=c.region)
        beat = asyncio.create_task(client.heartbeat_loop(lambda: REPORT))
        beats = lambda: c.metric("twine_agents_heartbeats_total")  # noqa: E731
        await until(lambda: beats() == 1, timeout=5, what="the first heartbeat", blocking=True)
        assert client.interval == 30
        client.notify()  # (each bound below is a third of the 30 s interval: "at once", not the next beat)
        await until(lambda: beats() == 2, timeout=10, what="the notified heartbeat", blocking=True)
        await asyncio.to_thread(restart, c)
        client.notify()  # the digest only, answered with resend: the full report follows at once
        await until(lambda: c.metric("twine_agents_heartbeat_reports_total") == 1, timeout=10,
                    what="the full report after resend", blocking=True)
        assert beats() == 2
        beat.cancel()
        await client.close()

    c.start()
    try:
        asyncio.run(scenario())
    finally:
        c.close()


def _container(task: TaskSpec, generation: int, status: str, exit_code: int | None = None) -> ContainerInfo:
    return ContainerInfo(f"c{task.index}-{generation}", "n", task_labels("m1", task, generation), status, exit_code, "", "")


def test_task_reports_cover_every_container_and_tasks_that_could_not_start():
    a, b, c = (TaskSpec.from_json({**TASK, "index": i, "spec_version": 2}, "", "t") for i in range(3))
    containers = [_container(b, 2, "exited", 1), _container(a, 1, "running"), _container(b, 3, "created")]
    reports = task_reports(containers, (a, b, c), {str(b.key): "start failed: x", str(c.key): "image gone"})
    assert [(r["index"], r["state"], r["restarts"], r["exit_code"], r["error"]) for r in reports] == [
        (0, "running", 0, None, ""),  # a task's first container: no restart yet
        (1, "exited", 1, 1, "start failed: x"),
        (1, "starting", 2, None, "start failed: x"),
        (2, "failed", 0, None, "image gone"),
    ]
    assert all(r["spec_version"] == 2 for r in reports)
    assert report_digest({}, reports) == report_digest({}, task_reports(containers[::-1], (a, b, c), {str(b.key): "start failed: x", str(c.key): "image gone"}))


# -- the real agent process ------------------------------------------------------------------


def _agent(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "agent", *args], check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=30)


def test_config_errors_exit_2_naming_the_problem(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    base = ("--state-dir", str(tmp_path / "state"), "run", "--machine-id", "m1", "--listen", f"127.0.0.1:{free_port()}")
    cp = ("--control-plane", "http://127.0.0.1:1")

    r = _agent(*base, *cp, "--bootstrap-token-file", str(token), "--desired", str(tmp_path / "d.toml"))
    assert r.returncode == 2 and "--desired and --control-plane are mutually exclusive" in r.stderr
    r = _agent(*base, *cp)
    assert r.returncode == 2 and "bootstrap_token_file" in r.stderr
    (tmp_path / "empty").write_text("\n")
    r = _agent(*base, *cp, "--bootstrap-token-file", str(tmp_path / "empty"))
    assert r.returncode == 2 and "token" in r.stderr and "empty" in r.stderr
    r = _agent(*base, "--control-plane", "controld:7000", "--bootstrap-token-file", str(token))
    assert r.returncode == 2 and "--control-plane" in r.stderr and "URL" in r.stderr
    (tmp_path / "agent.toml").write_text('heartbeat_interval = -1\n')
    r = _agent("--config", str(tmp_path / "agent.toml"), *base, *cp, "--bootstrap-token-file", str(token))
    assert r.returncode == 2 and "heartbeat_interval" in r.stderr
    assert not (tmp_path / "state").exists()  # nothing was started


async def _status(port: int, up: bool = True) -> dict:
    """The agent's /status; with up=False, an agent not listening yet gives {"control_plane": {}}."""
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/status") as r:
            return await r.json()
    except aiohttp.ClientConnectorError:
        if up:
            raise
        return {"control_plane": {}}


async def _start_agent(tmp_path: Path, url: str, machine_id: str, port: int, region: str) -> asyncio.subprocess.Process:
    token = tmp_path / "token"
    token.write_text(BOOTSTRAP + "\n")
    with open(tmp_path / "agent.log", "ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "--state-dir", str(tmp_path / "state"), "run",
            "--control-plane", url, "--bootstrap-token-file", str(token), "--machine-id", machine_id,
            "--listen", f"127.0.0.1:{port}", "--region", region, "--image-pull", "never", "--reconcile-interval", "0.5",
            "--heartbeat-interval", "0.2", "--cpus", "1.5", "--memory-mb", "256",
            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stderr=log,
        )


def _running(s: dict) -> dict | None:
    return next((t for t in s.get("tasks", []) if t["state"] == "running"), None)


@pytest.mark.docker
def test_agent_process_runs_the_daemons_tasks_keeps_them_while_it_is_away_and_after_a_restart(
        tmp_path, controld, docker_client, machine_id):
    async def scenario(procs: list) -> None:
        port = free_port()
        procs.append(await _start_agent(tmp_path, controld.url, machine_id, port, controld.region))
        await asyncio.to_thread(controld.wait_for, f"/v1/machines/{machine_id}", lambda m: m["healthy"],
                                what="the machine registered and healthy")
        submit(controld)
        job = await asyncio.to_thread(controld.wait_for, "/v1/jobs/web/api",
                                      lambda j: [t for t in j["tasks"] if t["state"] == "running"],
                                      what="the task running, as the daemon has it from the heartbeats")
        assert job["tasks"][0]["machine"] == machine_id
        m = controld.call("GET", f"/v1/machines/{machine_id}")[1]
        assert m["capacity"]["cpus"] == 1.5 and m["capacity"]["memory_mb"] == 256
        s = await _status(port)
        assert s["control_plane"] == {"url": controld.url, "urls": [controld.url], "heartbeat_to": None,
                                      "registered": True, "last_heartbeat_ok": True, "error": ""}
        version = s["desired"]["version"]
        task = _running(s)
        assert task["job"] == "web/api" and task["index"] == 0
        container = task["container"]["id"]

        # The daemon is gone: the task keeps running, /status says why nothing new arrives. The desired-state
        # poll and the heartbeat each find it out on their own next try, in either order.
        await asyncio.to_thread(controld.close)
        deadline = time.monotonic() + 5
        while not ((s := await _status(port))["control_plane"]["error"] and not s["control_plane"]["last_heartbeat_ok"]):
            assert time.monotonic() < deadline, s
            await asyncio.sleep(0.05)
        assert s["desired"]["error"].startswith("control plane unreachable") and not s["control_plane"]["last_heartbeat_ok"]
        assert _running(s)["container"]["id"] == container
        procs[0].send_signal(signal.SIGTERM)
        assert await procs[0].wait() == 0

        # Both restarted: the stored credential is reused, the desired state's version is the same
        # (a hash of its content), and nothing restarts.
        await asyncio.to_thread(controld.start)
        procs.append(await _start_agent(tmp_path, controld.url, machine_id, port, controld.region))
        await asyncio.to_thread(controld.wait_for, f"/v1/machines/{machine_id}", lambda m: m["healthy"],
                                what="the machine healthy after the restarts")
        deadline = time.monotonic() + 10
        while not ((s := await _status(port, up=False))["control_plane"].get("last_heartbeat_ok") and _running(s)):
            assert time.monotonic() < deadline, s
            await asyncio.sleep(0.05)
        assert controld.metric("twine_agents_registrations_total") == 0
        # the restarted daemon's own version of the machine's desired state is the one the agent holds,
        # and the agent has polled it (a poll with a different version would log a new desired state)
        await asyncio.to_thread(controld.wait_metrics, lambda m: m["twine_agents_long_polls_total"] >= 1,
                                what="the agent's first poll of the restarted daemon")
        assert controld.call("GET", f"/v1/machines/{machine_id}")[1]["desired_version"] == version
        assert s["desired"]["version"] == version and s["adopted"] == [container]
        assert _running(s)["container"]["id"] == container
        procs[1].send_signal(signal.SIGTERM)
        assert await procs[1].wait() == 0
        # The first agent logged the task's desired state (and the empty one before it when its first poll came
        # before the submit: the heartbeat that makes the machine healthy can win that race). The restarted one,
        # holding the same version, logged none.
        first, restarted = (tmp_path / "agent.log").read_text().split(f"agent {machine_id} up", 2)[1:]
        assert f"new desired state {version}" in first and "new desired state" not in restarted
        assert docker_client.containers.get(container).status == "running"

    procs: list[asyncio.subprocess.Process] = []
    try:
        asyncio.run(scenario(procs))
    finally:
        for p in procs:
            if p.returncode is None:
                os.kill(p.pid, signal.SIGKILL)
