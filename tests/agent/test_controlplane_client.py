"""The agent against the control-plane contract of docs/api.md ("Agents").

twine-controld is written in parallel, so these tests run the agent against `ContractServer`: a
protocol stand-in, in this file, for the three agent endpoints, with just enough state to hold
the agent to the contract (tokens, credentials, long poll, digests and resend).
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

from agent.config import AgentConfig
from agent.controlplane_client import ControlPlaneClient, ControlPlaneSource, Unauthorized
from agent.models import DesiredState, TaskSpec
from agent.report import machine_info, report_digest, task_reports
from agent.runtime.base import ContainerInfo, task_labels
from tests.agent.agentproc import REPO, free_port
from tests.conftest import TEST_IMAGE

BOOTSTRAP = "boot-" + "x" * 20
TASK = {"job": "web/front", "index": 0, "spec_version": 1, "image": TEST_IMAGE, "command": ["sleep", "300"], "cpus": 0.25, "memory_mb": 32}


class ContractServer:
    """Protocol stand-in for twine-controld's agent endpoints (register, desired, heartbeat)."""

    def __init__(self) -> None:
        self.url = ""
        self.registrations: list[dict] = []
        self.presented: list[str | None] = []  # the X-Twine-Credential each registration showed
        self.credentials: dict[str, str] = {}  # credential -> machine id
        self.desired = {"version": "v1", "profile": None, "tasks": []}
        self.heartbeats: list[dict] = []
        self.accepted: dict[str, str] = {}  # machine id -> digest of the last full report
        self.resend_next = False
        self.interval: float | None = None
        self.refuse_credentials = False
        self.heartbeat_to: object = None  # sent in heartbeat answers when set (the health-checking replica)
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
        if self.resend_next or ("tasks" not in body and self.accepted.get(machine) != body["digest"]):
            self.resend_next = False
            self.accepted.pop(machine, None)
            return web.json_response({"ok": True, "resend": True})
        self.accepted[machine] = body["digest"]
        hint = {"heartbeat_to": self.heartbeat_to} if self.heartbeat_to is not None else {}
        return web.json_response({"ok": True, **({"interval": self.interval} if self.interval else {}), **hint})


@asynccontextmanager
async def serving(server: ContractServer, port: int = 0) -> AsyncIterator[ContractServer]:
    runner = web.AppRunner(server.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


def client_for(url: str, state_dir: Path, machine: str = "m1", **config) -> ControlPlaneClient:
    cfg = AgentConfig(machine_id=machine, state_dir=state_dir, **config)
    return ControlPlaneClient(url, BOOTSTRAP, state_dir, machine_info(cfg))


async def until(predicate: Callable[[], object], timeout: float = 2.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


REPORT = {
    "desired_version": "v1",
    "health": {"ok": True, "problems": []},
    "profile": {"name": None, "ok": True, "error": ""},
    "tasks": [{"job": "web/front", "index": 0, "spec_version": 1, "state": "running", "exit_code": None, "restarts": 1, "error": ""}],
}


# -- registration ----------------------------------------------------------------------------


def test_registration_stores_a_private_credential_and_reuses_it_after_restart(tmp_path):
    async def scenario():
        async with serving(ContractServer()) as server:
            client = client_for(server.url, tmp_path, cpus=1.5, memory_mb=256)
            await client.desired("")
            await client.close()
            assert len(server.registrations) == 1
            reg = server.registrations[0]
            assert reg["machine_id"] == "m1" and reg["labels"]["dc"] == "dc1"
            cap = reg["capacity"]
            assert cap["cpus"] == 1.5 and cap["memory_mb"] == 256 and cap["disk_gb"] > 0
            assert cap["cgroup_version"] in (1, 2) and "sysctl" in cap["supports"]
            assert all(isinstance(kb, int) for kb in cap["hugepage_sizes_kb"])
            path = tmp_path / "credential"
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert json.loads(path.read_text())["credential"] == client.credential

            restarted = client_for(server.url, tmp_path)
            assert restarted.credential == client.credential
            await restarted.desired("")
            await restarted.close()
            assert len(server.registrations) == 1 and restarted.status()["registered"]

    asyncio.run(scenario())


def test_a_refused_credential_registers_again_once_with_the_bootstrap_token(tmp_path):
    async def scenario():
        async with serving(ContractServer()) as server:
            client = client_for(server.url, tmp_path)
            await client.desired("")
            first = client.credential
            server.revoke()
            await client.desired("")
            assert len(server.registrations) == 2 and client.credential != first
            # the first registration had no credential to show; the second showed the one it held
            assert server.presented == [None, first]
            assert json.loads((tmp_path / "credential").read_text())["credential"] == client.credential

            server.refuse_credentials = True  # a new credential is refused too: give up this call
            with pytest.raises(Unauthorized):
                await client.desired("")
            assert len(server.registrations) == 3
            assert client.status()["error"].startswith("control plane: ")
            await client.close()

    asyncio.run(scenario())


def test_a_wrong_bootstrap_token_is_reported_not_raised_from_the_loops(tmp_path):
    async def scenario():
        async with serving(ContractServer()) as server:
            client = ControlPlaneClient(server.url, "wrong", tmp_path, machine_info(AgentConfig(machine_id="m1", state_dir=tmp_path)))
            errors: list[str] = []
            watch = asyncio.create_task(ControlPlaneSource(client, "", wait=1).watch(_never, errors.append))
            beat = asyncio.create_task(client.heartbeat_loop(lambda: REPORT))
            await until(lambda: errors, what="an error")
            assert "registration refused" in errors[0] and not (tmp_path / "credential").exists()
            assert not watch.done() and not beat.done()
            watch.cancel(), beat.cancel()
            await client.close()

    asyncio.run(scenario())


async def _never(desired: DesiredState) -> None:
    raise AssertionError(f"unexpected desired state {desired}")


# -- desired state ---------------------------------------------------------------------------


def test_long_poll_delivers_new_desired_state_and_a_bad_one_goes_to_on_error(tmp_path):
    async def scenario():
        async with serving(ContractServer()) as server:
            client = client_for(server.url, tmp_path)
            source = ControlPlaneSource(client, "v1", wait=2)  # the agent's cached version
            changes: list[DesiredState] = []
            errors: list[str] = []

            async def on_change(d: DesiredState) -> None:
                changes.append(d)

            watch = asyncio.create_task(source.watch(on_change, errors.append))
            await asyncio.sleep(0.1)
            assert changes == []  # the version it already has: nothing changes

            server.set_desired("v2", [TASK])
            await until(lambda: changes, what="v2")
            assert changes[0].version == "v2" and changes[0].source == server.url
            assert changes[0].tasks == (TaskSpec.from_json(TASK, "", "t"),)

            server.set_desired("v3", [{**TASK, "memory_mb": 1}])
            await until(lambda: errors, what="the rejection")
            assert "tasks[0].memory_mb" in errors[0] and len(changes) == 1

            server.set_desired("v4", [])
            await until(lambda: len(changes) == 2, what="v4")
            assert changes[1].version == "v4" and changes[1].tasks == ()
            watch.cancel()
            await client.close()

    asyncio.run(scenario())


def test_an_unreachable_daemon_reports_an_error_changes_nothing_and_recovers(tmp_path):
    async def scenario():
        port = free_port()
        client = client_for(f"http://127.0.0.1:{port}", tmp_path)
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

        async with serving(ContractServer(), port) as server:
            server.set_desired("v2", [TASK])
            await until(lambda: changes, timeout=2.5, what="the daemon to be back")
            await until(lambda: server.heartbeats, what="a heartbeat")
            assert errors[-1] == "" and changes[0].version == "v2"  # the error is cleared
            await until(lambda: client.status()["last_heartbeat_ok"], what="last_heartbeat_ok")
            assert client.status()["error"] == "" and client.status()["registered"]
            watch.cancel(), beat.cancel()
            await client.close()

    asyncio.run(scenario())


# -- heartbeats ------------------------------------------------------------------------------


def test_heartbeat_sends_tasks_once_then_only_the_digest_and_resends_when_asked(tmp_path):
    async def scenario():
        async with serving(ContractServer()) as server:
            server.interval = 0.5
            client = client_for(server.url, tmp_path)
            for _ in range(2):
                await client.heartbeat(REPORT)
            first, second = server.heartbeats
            assert first["tasks"] == REPORT["tasks"] and "tasks" not in second
            assert first["digest"] == second["digest"] == report_digest(REPORT["profile"], REPORT["tasks"])
            assert second["seq"] > first["seq"] and first["desired_version"] == "v1"
            assert client.interval == 0.5

            server.resend_next = True
            await client.heartbeat(REPORT)  # answered with resend: true
            await client.heartbeat(REPORT)
            assert "tasks" not in server.heartbeats[2] and server.heartbeats[3]["tasks"] == REPORT["tasks"]

            changed = {**REPORT, "tasks": [{**REPORT["tasks"][0], "state": "exited", "exit_code": 3}]}
            await client.heartbeat(changed)
            assert server.heartbeats[4]["tasks"] == changed["tasks"]
            await client.close()

    asyncio.run(scenario())


def test_heartbeat_loop_sends_at_once_when_notified_and_after_a_resend(tmp_path):
    async def scenario():
        async with serving(ContractServer()) as server:
            client = client_for(server.url, tmp_path)
            client.interval = 30.0
            beat = asyncio.create_task(client.heartbeat_loop(lambda: REPORT))
            await until(lambda: len(server.heartbeats) == 1, what="the first heartbeat")
            client.notify()
            await until(lambda: len(server.heartbeats) == 2, timeout=0.5, what="the notified heartbeat")
            server.resend_next = True
            client.notify()
            await until(lambda: len(server.heartbeats) == 4, timeout=0.5, what="the full report after resend")
            assert server.heartbeats[3]["tasks"] == REPORT["tasks"]
            beat.cancel()
            await client.close()

    asyncio.run(scenario())


def _container(task: TaskSpec, generation: int, status: str, exit_code: int | None = None) -> ContainerInfo:
    return ContainerInfo(f"c{task.index}-{generation}", "n", task_labels("m1", task, generation), status, exit_code, "", "")


def test_task_reports_cover_every_container_and_tasks_that_could_not_start():
    a, b, c = (TaskSpec.from_json({**TASK, "index": i, "spec_version": 2}, "", "t") for i in range(3))
    containers = [_container(b, 2, "exited", 1), _container(a, 1, "running"), _container(b, 3, "created")]
    reports = task_reports(containers, (a, b, c), {str(b.key): "start failed: x", str(c.key): "image gone"})
    assert [(r["index"], r["state"], r["restarts"], r["exit_code"], r["error"]) for r in reports] == [
        (0, "running", 1, None, ""),
        (1, "exited", 2, 1, "start failed: x"),
        (1, "starting", 3, None, "start failed: x"),
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


async def _status(port: int) -> dict:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/status") as r:
        return await r.json()


async def _start_agent(tmp_path: Path, url: str, machine_id: str, port: int) -> asyncio.subprocess.Process:
    token = tmp_path / "token"
    token.write_text(BOOTSTRAP + "\n")
    with open(tmp_path / "agent.log", "ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "--state-dir", str(tmp_path / "state"), "run",
            "--control-plane", url, "--bootstrap-token-file", str(token), "--machine-id", machine_id,
            "--listen", f"127.0.0.1:{port}", "--image-pull", "never", "--reconcile-interval", "0.5",
            "--heartbeat-interval", "0.2", "--cpus", "1.5", "--memory-mb", "256",
            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, stderr=log,
        )


def _running_beat(server: ContractServer) -> dict | None:
    full = [h for h in server.heartbeats if h.get("tasks")]
    return full[-1] if full and full[-1]["tasks"][0]["state"] == "running" else None


@pytest.mark.docker
def test_agent_process_runs_the_daemons_tasks_keeps_them_while_it_is_away_and_after_a_restart(tmp_path, docker_client, machine_id):
    async def scenario(server: ContractServer, procs: list) -> None:
        port, api = free_port(), free_port()
        server.set_desired("v7", [TASK])
        async with serving(server, api):
            procs.append(await _start_agent(tmp_path, server.url, machine_id, port))
            await until(lambda: _running_beat(server), timeout=10, what="a heartbeat with the task running")
            beat = _running_beat(server)
            assert beat["desired_version"] == "v7" and beat["machine_id"] == machine_id
            assert beat["tasks"][0]["job"] == "web/front" and beat["profile"] == {"name": None, "ok": True, "error": ""}
            assert server.registrations[0]["capacity"]["cpus"] == 1.5
            s = await _status(port)
            assert s["control_plane"] == {"url": server.url, "urls": [server.url], "heartbeat_to": None, "registered": True,
                                          "last_heartbeat_ok": True, "error": ""}
            assert s["desired"]["version"] == "v7" and s["tasks"][0]["state"] == "running"
            container = s["tasks"][0]["container"]["id"]

        # The daemon is gone: the task keeps running, /status says why nothing new arrives. The desired-state
        # poll and the heartbeat each find it out on their own next try, in either order.
        deadline = time.monotonic() + 5
        while not ((s := await _status(port))["control_plane"]["error"] and not s["control_plane"]["last_heartbeat_ok"]):
            assert time.monotonic() < deadline, s
            await asyncio.sleep(0.05)
        assert s["desired"]["error"].startswith("control plane unreachable") and not s["control_plane"]["last_heartbeat_ok"]
        assert s["tasks"][0]["state"] == "running" and s["tasks"][0]["container"]["id"] == container
        procs[0].send_signal(signal.SIGTERM)
        assert await procs[0].wait() == 0

        # Restarted onto the same version: the stored credential is reused and nothing changes.
        server.heartbeats.clear()
        async with serving(server, api):
            procs.append(await _start_agent(tmp_path, server.url, machine_id, port))
            await until(lambda: _running_beat(server), timeout=10, what="a heartbeat after the restart")
            assert len(server.registrations) == 1
            s = await _status(port)
            assert s["tasks"][0]["container"]["id"] == container and s["adopted"] == [container]
        procs[1].send_signal(signal.SIGTERM)
        assert await procs[1].wait() == 0
        assert (tmp_path / "agent.log").read_text().count("new desired state") == 1
        assert docker_client.containers.get(container).status == "running"

    procs: list[asyncio.subprocess.Process] = []
    try:
        asyncio.run(scenario(ContractServer(), procs))
    finally:
        for p in procs:
            if p.returncode is None:
                os.kill(p.pid, signal.SIGKILL)
