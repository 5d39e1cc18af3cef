"""A real `twine-controld` process on a free loopback port, on the session's etcd, in a region of
its own (so tests sharing one etcd never see each other's keys)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from controlplane.store.etcdproc import terminate
from tests.conftest import parse_metrics
from tests.agent.agentproc import REPO, free_port

API_TOKEN = "test-api-token"
BOOTSTRAP_TOKEN = "test-bootstrap-token"


def _region_key(region: str) -> str:
    """The region's sealing key line: the same for every replica of a region (as an operator
    gives them one key file), another for every other region."""
    return "key1:" + base64.b64encode(hashlib.sha256(f"twine-test-{region}".encode()).digest()).decode()


class Controld:
    def __init__(self, tmp: Path, etcd_port: int, heartbeat_timeout: float = 2.0, region: str | None = None,
                 env: dict[str, str] | None = None, extra: tuple[str, ...] = (), ca: Path | None = None):
        self.tmp = tmp
        self.env = env
        self.extra = extra
        self.etcd_port = etcd_port
        self.region = region or "r" + uuid.uuid4().hex[:10]
        self.port = free_port()
        self.heartbeat_timeout = heartbeat_timeout
        self.api_file = tmp / "api-tokens"
        self.boot_file = tmp / "bootstrap-tokens"
        # secret task values sealed in etcd, as installed regions have them (--secret-key-file)
        self.key_file = tmp / "secret-keys"
        for f, token in ((self.api_file, API_TOKEN), (self.boot_file, BOOTSTRAP_TOKEN),
                         (self.key_file, _region_key(self.region))):
            f.write_text(token + "\n")
            f.chmod(0o600)  # the daemon refuses token files others may read
        self.log = tmp / f"controld-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        # served over TLS (extra has --tls-cert/--tls-key): requests verify it against `ca`
        self.tls = ssl.create_default_context(cafile=str(ca)) if ca is not None else None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def launch(self) -> "Controld":
        """The process, without waiting for it (start() waits)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.daemon", "--etcd", f"127.0.0.1:{self.etcd_port}",
             "--region", self.region, "--listen", f"127.0.0.1:{self.port}", "--api-token-file", str(self.api_file),
             "--bootstrap-token-file", str(self.boot_file), "--heartbeat-timeout", str(self.heartbeat_timeout),
             *(() if "--secret-key-file" in self.extra else ("--secret-key-file", str(self.key_file))), *self.extra],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, **self.env} if self.env else None)
        return self

    def start(self, wait_led: bool = True, timeout: float = 20) -> "Controld":
        """Launch and wait until it answers (and leads, with `wait_led`); a start that fails stops
        the process before it raises (a fixture whose start raised never reaches its close())."""
        self.launch()
        try:
            return self._await_start(wait_led, timeout)
        except BaseException:
            self.close()
            raise

    def _await_start(self, wait_led: bool, timeout: float) -> "Controld":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"controld exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1, context=self.tls).read()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError(f"controld did not answer in {timeout:g} s")
        if wait_led:
            self.wait_led(deadline)
        return self

    def metrics(self) -> dict[str, float]:
        """GET /v1/metrics, name -> value."""
        req = urllib.request.Request(self.url + "/v1/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
        with urllib.request.urlopen(req, timeout=10, context=self.tls) as r:
            return parse_metrics(r.read().decode())

    def wait_metrics(self, predicate, timeout: float = 10, what: str = "condition") -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while not predicate(m := self.metrics()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {m}")
            time.sleep(0.05)
        return m

    def metric(self, name: str) -> float:
        values = self.metrics()
        if name not in values:
            raise AssertionError(f"no metric {name}")
        return values[name]

    def cluster(self) -> dict:
        return self.call("GET", "/v1/cluster")[1]

    def wait_led(self, deadline: float) -> None:
        """Until this process is a member and every shard of the region has a leader (one that
        is a member): what API calls that place tasks need."""
        while time.monotonic() < deadline:
            c = self.cluster()
            members = {m["id"] for m in c.get("members", [])}
            if c.get("self") and c["self"]["member"] in members and c["shards"] \
                    and all(s["leader"] in members for s in c["shards"]):
                return
            time.sleep(0.05)
        raise AssertionError(f"no leader for every shard in time: {self.cluster()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None:
            terminate(self.proc)

    def call(self, method: str, path: str, body: object = None, token: str | None = API_TOKEN,
             timeout: float = 30) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.tls) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def wait_for(self, path: str, predicate, timeout: float = 20, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            status, last = self.call("GET", path)
            if status == 200 and predicate(last):
                return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last: {json.dumps(last)[:3000]}\n"
                             f"log: {self.log.read_text()[-3000:]}")


@contextlib.contextmanager
def daemon_with_sim_agents(tmp: Path, etcd_port: int, machines: tuple[str, ...], heartbeat_timeout: float,
                           interval: float = 0.2, dcs: int = 1, cpus: float = 4, extra: tuple[str, ...] = ()):
    """A real twine-controld with `machines` registered (spread over `dcs` dcs, an MSB each) and
    simulated agents for them (tests/controlplane/simagents.py): yields (daemon, agents); closes both."""
    from tests.controlplane.simagents import SimAgents
    from tests.controlplane.frontend.test_controld_api import register

    c = Controld(tmp, etcd_port, heartbeat_timeout=heartbeat_timeout, extra=extra).start()
    try:
        creds = {m: register(c, m, f"dc{i % dcs + 1}", f"msb-{m}", cpus=cpus, memory_mb=4096)
                 for i, m in enumerate(machines)}
        with SimAgents(creds, [c.url], interval=interval) as agents:
            yield c, agents
    finally:
        c.close()


def wait(pred, timeout: float, what: str, interval: float = 0.05):
    """pred() once it is true (returned), polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def member(c: Controld) -> str:
    """The member id a replica answers as (GET /v1/cluster)."""
    return c.cluster()["self"]["member"]
