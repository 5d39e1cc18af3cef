"""An agent with several twine-controld replicas of one region (issue #10): which URL it calls, when
it moves on, where its heartbeats go, and that its credential holds on every replica.

The tests of which URL is called and when the client moves on run it against `FaultServer`
stand-ins (two of them sharing one credential table, as replicas share etcd) and servers that
answer every call with one status: faults on demand. Where heartbeats go runs against real
replicas, one of them a health check of its own; the last test runs a real agent process, with a
real task, against two real `twine-controld` replicas on one etcd, and kills the first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp import web

from agent.cli import _parser
from agent.config import Labels, load_config
from agent.controlplane_client import REQUEST_TIMEOUT, ControlPlaneError, Unavailable
from agent.errors import InputError
from controlplane.coordination.coordinator import rendezvous
from tests.agent.agentproc import AgentProc, free_port
from tests.agent.test_controlplane_client import REPORT, FaultServer, _agent, client_for, serving
from tests.conftest import TEST_IMAGE
from tests.controlplane.controld_proc import BOOTSTRAP_TOKEN, Controld, wait


def replicas(n: int = 2) -> list[FaultServer]:
    """Stand-ins of one region: a credential issued by one is known to all."""
    servers = [FaultServer() for _ in range(n)]
    for s in servers[1:]:
        s.credentials = servers[0].credentials
    return servers


@asynccontextmanager
async def answering(status: int, body: str, content_type: str) -> AsyncIterator[str]:
    """A server that answers every request with `status`, e.g. a proxy whose replica is down."""
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, text=body, content_type=content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


# -- configuration ---------------------------------------------------------------------------


def _load(tmp_path: Path, *flags: str, toml: str = "") -> tuple[str, ...]:
    (tmp_path / "agent.toml").write_text(toml)
    return load_config(_parser().parse_args(["--config", str(tmp_path / "agent.toml"), "run", *flags])).control_plane


def test_control_plane_is_one_url_or_a_list_and_a_bad_one_is_named(tmp_path):
    assert _load(tmp_path, "--control-plane", "http://a:1/") == ("http://a:1",)
    assert _load(tmp_path, "--control-plane", "http://a:1, https://b:2/") == ("http://a:1", "https://b:2")
    assert _load(tmp_path, toml='control_plane = "http://a:1"') == ("http://a:1",)
    assert _load(tmp_path, toml='control_plane = ["http://a:1", "http://b:2"]') == ("http://a:1", "http://b:2")
    assert _load(tmp_path, "--control-plane", "http://c:3", toml='control_plane = ["http://a:1"]') == ("http://c:3",)
    for flags, toml, value, why in [
        (("--control-plane", "http://a:1,b:2"), "", "b:2", "http:// or https:// URL"),
        (("--control-plane", "http://a:1,,http://b:2"), "", "http://a:1,,http://b:2", "empty URL"),
        (("--control-plane", "http://a:1,http://a:1/"), "", "http://a:1/", "listed twice"),
        ((), 'control_plane = ["http://a:1", 7]', 7, "URL"),
        ((), "control_plane = []", [], "at least one"),
    ]:
        with pytest.raises(InputError) as e:
            _load(tmp_path, *flags, toml=toml)
        assert e.value.field in ("--control-plane", "control_plane") and e.value.value == value and why in e.value.why
    token = tmp_path / "token"
    token.write_text("secret\n")
    r = _agent("--state-dir", str(tmp_path / "state"), "run", "--machine-id", "m1", "--listen", f"127.0.0.1:{free_port()}",
               "--control-plane", "http://ok:1,controld2:7000", "--bootstrap-token-file", str(token))
    assert r.returncode == 2 and "'controld2:7000'" in r.stderr and "URL" in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()


# -- which replica -----------------------------------------------------------------------------


def test_a_replica_that_does_not_answer_is_left_for_the_next_one_and_a_refusal_is_not(tmp_path, caplog):
    caplog.set_level(logging.INFO, "twine.agent.controlplane")

    async def scenario():
        (good,) = replicas(1)
        dead = f"http://127.0.0.1:{free_port()}"
        async with serving(good), answering(503, "<html>no backend</html>", "text/html") as proxy:
            client = client_for([dead, proxy, good.url], tmp_path / "a")
            with pytest.raises(OSError):  # connection refused
                await client.desired("")
            assert client.url == proxy
            with pytest.raises(Unavailable):
                await client.desired("")
            assert client.url == good.url
            await client.desired("")
            s = client.status()
            assert s["url"] == good.url and s["urls"] == [dead, proxy, good.url] and s["error"] == "" and s["registered"]
            assert len(good.registrations) == 1
            await client.close()

        async with serving(good), answering(500, '{"error": "bug", "why": "boom"}', "application/json") as broken:
            client = client_for([broken, good.url], tmp_path / "b")
            for _ in range(2):  # the replica answered: another one would answer the same
                with pytest.raises(ControlPlaneError):
                    await client.desired("")
                assert client.url == broken
            await client.close()

    asyncio.run(scenario())
    switches = [r.getMessage() for r in caplog.records if "switching to" in r.getMessage()]
    assert len(switches) == 2 and switches[0].startswith("control plane http://127.0.0.1:"), switches


def test_calls_failing_together_move_on_once_and_the_credential_holds_on_the_next_replica(tmp_path, caplog):
    caplog.set_level(logging.INFO, "twine.agent.controlplane")

    async def scenario():
        a, b = replicas()
        async with serving(b):
            async with serving(a):
                client = client_for([a.url, b.url], tmp_path)
                await client.desired("")  # registers through a
                await client.heartbeat(REPORT)
            saved = (tmp_path / "credential").read_bytes()
            # The long poll and a heartbeat both find a gone; with two URLs, moving on twice would be back at a.
            results = await asyncio.gather(client.desired("v1", wait=1), client.heartbeat(REPORT), return_exceptions=True)
            assert all(isinstance(r, OSError) for r in results), results
            assert client.url == b.url and not client.status()["last_heartbeat_ok"]
            await client.desired("")
            await client.heartbeat(REPORT)
            assert len(b.heartbeats) == 1 and client.status()["last_heartbeat_ok"] and client.status()["error"] == ""
            assert len(a.registrations) == 1 and b.registrations == []
            assert (tmp_path / "credential").read_bytes() == saved
            await client.close()

    asyncio.run(scenario())
    assert sum("switching to" in r.getMessage() for r in caplog.records) == 1


def test_the_credential_is_the_regions_and_a_file_keyed_by_a_listed_url_is_still_accepted(tmp_path):
    async def scenario():
        a, b = replicas()
        path = tmp_path / "credential"
        async with serving(a), serving(b):
            client = client_for([a.url], tmp_path)
            await client.desired("")
            saved = json.loads(path.read_text())
            assert saved == {"machine_id": "m1", "region": "region1", "url": a.url, "credential": client.credential}

            other = client_for([b.url], tmp_path)  # another list of the same region's replicas
            assert other.credential == client.credential
            await other.desired("")

            # The file of an agent from before replicas: keyed by its one URL.
            old = json.dumps({"url": a.url, "machine_id": "m1", "credential": client.credential})
            path.write_text(old)
            upgraded = client_for([b.url, a.url], tmp_path)
            assert upgraded.credential == client.credential
            await upgraded.desired("")
            assert path.read_text() == old
            assert len(a.registrations) == 1 and b.registrations == []
            assert client_for([b.url], tmp_path).credential is None  # its URL is not in this list

            path.write_text(json.dumps(saved))
            assert client_for([b.url], tmp_path, machine="m2").credential is None
            assert client_for([a.url], tmp_path, labels=Labels(region="region2")).credential is None
            for c in (client, other, upgraded):
                await c.close()

    asyncio.run(scenario())


# -- heartbeat_to ------------------------------------------------------------------------------


def test_heartbeats_follow_heartbeat_to_and_go_back_to_the_list_at_once_when_it_fails(tmp_path, etcd_server):
    """Real replicas: `a` serves the API and schedules, `h` is the health check of its own (`--roles
    health`). The agent knows only `a`; a's answer names h, and heartbeats, and only they, go there."""
    for d in ("a", "h", "agent"):
        (tmp_path / d).mkdir()
    a = Controld(tmp_path / "a", etcd_server.port, extra=("--roles", "frontend,scheduler")).start()
    h = Controld(tmp_path / "h", etcd_server.port, region=a.region, extra=("--roles", "health"))

    async def scenario():
        await asyncio.to_thread(h.start, False)
        await asyncio.to_thread(wait, lambda: len(a.cluster()["members"]) == 2, 10, "h a member in a's view")
        client = client_for([a.url], tmp_path / "agent", region=a.region)
        await client.heartbeat(REPORT)  # registers through a, which answers with h
        assert client.status()["heartbeat_to"] == h.url and a.metric("twine_agents_heartbeats_total") == 1
        await client.heartbeat(REPORT)  # h has no report yet: it asks for the full one
        await client.heartbeat(REPORT)
        assert a.metric("twine_agents_heartbeats_total") == 1
        assert h.metric("twine_agents_heartbeats_total") == 2 and h.metric("twine_agents_heartbeat_reports_total") == 1
        await client.desired("")  # only heartbeats move
        assert client.desired_from == a.url and client.url == a.url

        await asyncio.to_thread(h.kill, signal.SIGKILL)  # h gone: a checks the machine again
        await client.heartbeat(REPORT)  # refused by h: the same heartbeat goes to a, without an error
        s = client.status()
        assert a.metric("twine_agents_heartbeats_total") == 2 and s["last_heartbeat_ok"] and s["error"] == ""
        # (until h's lease ends, a's answer still names it: not followed, h failed a moment ago)
        await asyncio.to_thread(wait, lambda: len(a.cluster()["members"]) == 1, 10, "h's membership over")
        await client.heartbeat(REPORT)
        s = client.status()
        assert a.metric("twine_agents_heartbeats_total") == 3
        assert s["heartbeat_to"] is None and s["last_heartbeat_ok"] and s["error"] == ""
        await client.close()

    try:
        asyncio.run(scenario())
    finally:
        a.close()
        h.close()


def test_a_hint_that_is_no_url_or_the_url_in_use_or_a_downgrade_is_not_followed(tmp_path):
    """Hints the daemon never sends, from a stand-in's heartbeat answers."""
    async def scenario():
        async with serving(FaultServer()) as a:
            client = client_for([a.url], tmp_path)
            for hint in ("ftp://x", 42, ["x"], {"url": "http://b:2"}, "http://", a.url + "/"):
                a.heartbeat_to = hint  # not a URL, or the URL in use: heartbeats stay
                await client.heartbeat(REPORT)
                assert client.heartbeat_to is None, hint
            assert len(a.heartbeats) == 6
            a.heartbeat_to = None
            client.heartbeat_to = "http://127.0.0.1:1"  # followed earlier; that replica is gone
            await client.heartbeat(REPORT)  # refused there: the list at once, and an answer without a hint
            assert len(a.heartbeats) == 7 and client.heartbeat_to is None
            await client.close()

    asyncio.run(scenario())
    https = client_for(["https://a:1"], tmp_path / "tls")
    https._follow("http://b:2")  # never from TLS to plain HTTP with the machine's credential
    assert https.heartbeat_to is None
    https._follow("https://b:2")
    assert https.heartbeat_to == "https://b:2"


def test_a_replica_that_takes_heartbeats_and_never_answers_is_left_within_half_the_regions_timeout(tmp_path):
    """A replica that accepts the connection and never answers (stuck, or cut off from this machine
    alone: it keeps its lease and the machine's health): a heartbeat waits half the region's
    heartbeat timeout, as its answers say it, not REQUEST_TIMEOUT (10 s), so another replica hears
    the machine before the region fails it. A hint that failed is not followed again for a while."""
    timeout = 4.0  # the region's, as the stand-ins say it

    async def scenario():
        a, b = replicas(2)
        for r in (a, b):
            r.pace = {"interval": 0.2, "timeout": timeout}
        async with serving(a), serving(b):
            # b names a as the machine's health checker, and a stops answering: a heartbeat sent
            # there is left after half the timeout and reaches b in the same call, and a is not
            # asked again meanwhile
            b.heartbeat_to = a.url
            client = client_for([b.url, a.url], tmp_path / "hint")
            assert client._beat_timeout(True) == REQUEST_TIMEOUT, "nothing said yet: the whole timeout"
            await client.heartbeat(REPORT)
            assert client.heartbeat_timeout == timeout and client.heartbeat_to == a.url
            a.hang = True
            t0, seen = time.monotonic(), len(b.heartbeats)
            await client.heartbeat(REPORT)  # no error: the list's replica answered it
            waited = time.monotonic() - t0
            assert a.hung == 1 and len(b.heartbeats) == seen + 1, (a.hung, len(b.heartbeats))
            assert timeout / 2 <= waited < timeout, f"waited {waited:.2f}s for the stuck replica"
            for _ in range(3):  # b still names a: not followed again (HINT_PAUSE)
                await client.heartbeat(REPORT)
            assert a.hung == 1 and len(b.heartbeats) == seen + 4 and client.heartbeat_to is None
            await client.close()

            # a list of two whose first stops answering: the heartbeat ends after half the
            # timeout, and the next goes to the second
            b.heartbeat_to, a.hang = None, False
            client = client_for([a.url, b.url], tmp_path / "list", machine="m2")
            await client.heartbeat(REPORT)
            assert client.heartbeat_timeout == timeout and len(a.heartbeats) == 1
            a.hang = True
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await client.heartbeat(REPORT)
            waited = time.monotonic() - t0
            assert a.hung == 2 and client.url == b.url
            await client.heartbeat(REPORT)
            assert b.heartbeats[-1]["machine_id"] == "m2" and client.status()["last_heartbeat_ok"]
            assert timeout / 2 <= waited < timeout, f"waited {waited:.2f}s for the stuck replica"
            await client.close()

            one = client_for([b.url], tmp_path / "one", machine="m3")  # one URL and no hint: nowhere else to go
            await one.heartbeat(REPORT)
            assert one.heartbeat_timeout == timeout and one._beat_timeout(False) == REQUEST_TIMEOUT
            assert one._beat_timeout(True) == timeout / 2
            await one.close()

    for d in ("hint", "list", "one"):
        (tmp_path / d).mkdir()
    asyncio.run(scenario())


# -- the real thing: two twine-controld replicas, one agent process, a real task ---------------


class ControlPlaneAgent(AgentProc):
    """A `twine-agent run --control-plane URL,URL` process."""

    def __init__(self, tmp: Path, machine_id: str, urls: list[str], region: str):
        super().__init__(tmp, machine_id, tmp / "unused")
        self.urls, self.region = urls, region
        self.token = tmp / "bootstrap-token"
        self.token.write_text(BOOTSTRAP_TOKEN + "\n")

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "agent", "--state-dir", str(self.state), "run",
            "--control-plane", ",".join(self.urls), "--bootstrap-token-file", str(self.token),
            "--listen", f"127.0.0.1:{self.port}", "--machine-id", self.machine_id, "--region", self.region,
            "--image-pull", "never", "--reconcile-interval", "0.5", "--cpus", "1", "--memory-mb", "512",
        ]


def running(s: dict) -> dict[int, tuple[str, int]]:
    return {t["index"]: (t["container"]["id"], t["restarts"]) for t in s["tasks"] if t["state"] == "running"}


@pytest.mark.docker
def test_the_agent_fails_over_to_the_second_replica_without_registering_again_or_restarting_a_task(
        tmp_path, etcd_server, docker_client, machine_id):
    for d in ("a", "b", "agent"):
        (tmp_path / d).mkdir()
    # Both replicas from the start: each judges the health of its share of the machines, hearing of
    # the others' heartbeats by relay (and agents are sent to the owner with heartbeat_to).
    timeout = 3.0
    extra = ("--heartbeat-interval", "0.3")
    a = Controld(tmp_path / "a", etcd_server.port, heartbeat_timeout=timeout, extra=extra).start()
    b = Controld(tmp_path / "b", etcd_server.port, heartbeat_timeout=timeout, region=a.region, extra=extra).start()
    b_started = time.monotonic()
    agent = ControlPlaneAgent(tmp_path / "agent", machine_id, [a.url, b.url], a.region)
    task = {"image": TEST_IMAGE, "command": ["sleep", "3600"], "cpus": 0.25, "memory_mb": 16}
    try:
        agent.start()
        a.wait_for("/v1/machines", lambda r: [m for m in r["machines"] if m["id"] == machine_id], what="registration")
        assert a.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        assert a.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": task})[0] == 201
        before = running(agent.wait_for(lambda s: 0 in running(s), what="the task running"))
        credential = (agent.state / "credential").read_bytes()

        b.wait_for(f"/v1/machines/{machine_id}", lambda m: m["healthy"], what="b to see the machine")
        a.kill(signal.SIGKILL)
        # (the long poll in flight to a fails too, and is asked again of b after its backoff)
        s = agent.wait_for(lambda s: s["control_plane"]["url"] == b.url and s["control_plane"]["last_heartbeat_ok"]
                           and s["control_plane"]["error"] == "" and s["control_plane"]["heartbeat_to"] is None,
                           what="heartbeats and the long poll through b (a's lease gone: b owns every machine)")
        assert s["control_plane"]["urls"] == [a.url, b.url]
        shown = _agent("status", "--listen", f"127.0.0.1:{agent.port}")
        assert f"control plane: {b.url} (then {a.url}); registered\n" in shown.stdout, shown
        beats = b.metric("twine_agents_heartbeats_total")
        time.sleep(1.0)
        assert b.metric("twine_agents_heartbeats_total") >= beats + 2

        # The long poll goes through b too: a change made there reaches the agent.
        assert b.call("POST", "/v1/jobs/web/api/resize", {"count": 2})[0] == 200
        s = agent.wait_for(lambda s: set(running(s)) == {0, 1}, what="the second task, through b")
        assert s["desired"]["source"] == b.url and running(s)[0] == before[0]

        # Past b's start-up grace: the machine is healthy on b's own evidence, and nothing failed.
        time.sleep(max(0.0, timeout + 6.5 - (time.monotonic() - b_started)))
        machine = b.call("GET", f"/v1/machines/{machine_id}")[1]
        assert machine["healthy"], machine
        assert not [e for e in b.call("GET", "/v1/events")[1]["events"] if e["kind"] == "failure"]
        assert b.metric("twine_health_failures_total") == 0
        assert b.metric("twine_agents_registrations_total") == 0 and b.metric("twine_agents_long_polls_total") > 0
        assert running(agent.status())[0] == before[0]  # same container, no restart
        assert docker_client.containers.get(before[0][0]).status == "running"
        assert (agent.state / "credential").read_bytes() == credential
        log = agent.log.read_text()
        assert log.count(f"switching to {b.url}") == 1 and log.count("registered machine") == 1, log[-3000:]
    finally:
        agent.close()
        a.close()
        b.close()


class HoldingProxy:
    """A replica's address in front of it (it advertises this one): every request passes, except,
    once `hold` is set, the agents' (/v1/agent/...), which are taken and never answered: the
    replica is cut off from its machines and still a member (its lease, its relays)."""

    def __init__(self, upstream: str):
        self.upstream, self.port = upstream, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hold = False
        self.held = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> "HoldingProxy":
        self._thread.start()
        assert self._ready.wait(10), "the proxy did not start"
        return self

    def __exit__(self, *exc) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        import aiohttp

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.StreamResponse:
            if self.hold and request.path.startswith("/v1/agent/"):
                self.held += 1
                await asyncio.Event().wait()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            async with session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                       data=await request.read()) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    headers={"Content-Type": r.headers.get("Content-Type", "application/json")})

        app = web.Application(client_max_size=4 << 20)
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await session.close()


@pytest.mark.docker
def test_a_machine_cut_off_from_the_replica_that_checks_it_stays_healthy_through_another(
        tmp_path, etcd_server, docker_client):
    """Two replicas; the machine's health is checked by `a`, which is then cut off from the agent
    alone (its proxy takes the agent's calls and never answers; a keeps its lease, and b's relays
    reach it). The agent leaves a within half the region's heartbeat timeout (4 s) and its
    heartbeats reach a through b: the machine is never failed. With the whole request timeout
    (10 s) of before, the agent was still waiting on a when a failed the machine, about 8 s after
    the cut here."""
    for d in ("a", "b", "agent"):
        (tmp_path / d).mkdir()
    timeout = 4.0
    a = Controld(tmp_path / "a", etcd_server.port, heartbeat_timeout=timeout)
    with HoldingProxy(a.url) as proxy:
        a.extra = ("--heartbeat-interval", "0.3", "--advertise", proxy.url)
        a.start()
        b = Controld(tmp_path / "b", etcd_server.port, heartbeat_timeout=timeout, region=a.region,
                     extra=("--heartbeat-interval", "0.3")).start()
        agent = None
        try:
            wait(lambda: len(a.cluster()["members"]) == 2, 10, "both members")
            members = a.cluster()["members"]
            a_id = next(m["id"] for m in members if m["url"] == proxy.url)
            health = sorted(m["id"] for m in members if "health" in m["roles"])
            machine = next(mid for mid in (f"test{uuid.uuid4().hex[:20]}" for _ in range(1000))
                           if rendezvous(health, mid) == a_id)  # a judges this machine
            agent = ControlPlaneAgent(tmp_path / "agent", machine, [proxy.url, b.url], a.region)
            agent.start()
            a.wait_for(f"/v1/machines/{machine}", lambda m: m["healthy"], what="the machine healthy on a")
            agent.wait_for(lambda s: s["control_plane"]["url"] == proxy.url and s["control_plane"]["last_heartbeat_ok"],
                           what="heartbeats to a")
            proxy.hold = True
            cut = time.monotonic()
            verdicts = []
            while time.monotonic() - cut < 3 * timeout:
                verdicts.append(a.call("GET", f"/v1/machines/{machine}")[1]["healthy"])
                time.sleep(0.3)
            s = agent.status()["control_plane"]
            print(f"{proxy.held} agent calls held at a; the agent now calls {s['url']}; "
                  f"{b.metric('twine_relay_seen_relayed_total'):.0f} heartbeats relayed by b")
            assert all(verdicts), f"the machine was failed: {verdicts}"
            assert proxy.held >= 1 and s["url"] == b.url and s["last_heartbeat_ok"], s
            assert not [e for e in a.call("GET", "/v1/events")[1]["events"] if e["kind"] == "failure"]
            assert a.metric("twine_health_failures_total") == 0 and b.metric("twine_health_failures_total") == 0
            assert b.metric("twine_relay_seen_relayed_total") > 0, "b relayed the heartbeats to a"
        finally:
            if agent is not None:
                agent.close()
            b.close()
            a.close()
