"""The dev region itself: etcd, twine-controld and the agents, started and stopped; its paths and
names are layout.py's, its rehearsed failures (kill, restart, partition, heal) faults.py's."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Self

import psutil

from controlplane.store.etcdproc import EtcdServer
from controlplane.security.sealing import Sealer
from controlplane.devregion.etcd import Etcd
from controlplane.devregion.faults import Faults
from controlplane.devregion.layout import ETCD_USER, MEMBER_COUNTS, STATE_FILE, Layout, is_etcd_member
from controlplane.devregion.network import MAX_AGENTS, NAME_RE, Network, ip_binary, ns_http_get, orphaned_prefixes
from controlplane.devregion.procs import REPO, ProcRef, child_env, log_tail, spawn, stop_process
from controlplane.devregion.spec import AgentSpec

log = logging.getLogger("twine.devregion")

AGENT_LISTEN = "127.0.0.1:7070"
CONTROLD_PORT = 7080  # preferred; another free port on the bridge address if taken
PROFILE_APPLIED = "profile-applied.json"  # agent/profiles/engine.py APPLIED
MACHINE_LABEL = "twine.machine"  # agent/runtime/base.py L_MACHINE
JOB_LABEL = "twine.job"


def _write_secret(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, 0o600)


def with_cgroups(argv: list[str], mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """argv, run once the cgroup hierarchies an agent reads its tasks' usage from (agent/usage.py:
    cpuacct, memory, the v2 one) are mounted again under the fresh /sys of `ip netns exec`, as on
    the host: a v1 hierarchy mounted with the same controllers is the same hierarchy."""
    steps = []
    for line in Path(mountinfo).read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) >= 5 and len(kind) >= 3 and fields[4] == "/sys/fs/cgroup" and kind[0] == "cgroup2":
            return ["/bin/sh", "-c", 'mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"', "sh", *argv]  # v2 alone
        if len(fields) < 5 or len(kind) < 3 or not fields[4].startswith("/sys/fs/cgroup/"):
            continue
        where = shlex.quote(fields[4])
        if kind[0] == "cgroup2":
            steps.append(f"mkdir -p {where} && mount -t cgroup2 cgroup2 {where}")
        elif kind[0] == "cgroup":
            controllers = [o for o in kind[2].split(",") if o not in ("rw", "ro") and "=" not in o]
            if {"cpuacct", "memory"} & set(controllers):
                steps.append(f"mkdir -p {where} && mount -t cgroup -o {','.join(controllers)} cgroup {where}")
    if not steps:
        return argv
    script = " && ".join(["mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup", *steps, 'exec "$@"'])
    return ["/bin/sh", "-c", script, "sh", *argv]


class Region(Layout, Etcd, Faults):
    """etcd + one twine-controld + one agent per AgentSpec, each agent in its own netns.

    `start()` brings it all up and returns once controld answers and every agent's /status
    answers (on failure it tears down what it started and raises). `stop()` tears everything down
    and returns the problems it met; it is safe after a partial start and safe to call twice.
    """

    def __init__(self, workdir: str | Path, agents: Iterable[AgentSpec], region: str = "local",
                 heartbeat_timeout: float = 3.0, *, start_timeout: float = 60.0,
                 controld_args: tuple[str, ...] = (), etcd_members: int = 1) -> None:
        self.workdir = Path(workdir).resolve()
        self.controld_args = tuple(controld_args)  # extra twine-controld flags (e.g. --rate-limits)
        self.specs: dict[str, AgentSpec] = {}
        for a in agents:
            if not NAME_RE.fullmatch(a.name):
                raise ValueError(f"agent name {a.name!r}: 1-20 of a-z, 0-9, '-'")
            if a.name in self.specs or a.name in ("etcd", "controld") or is_etcd_member(a.name):
                raise ValueError(f"agent name {a.name!r} is used twice or reserved")
            self.specs[a.name] = a
        if len(self.specs) > MAX_AGENTS:
            raise ValueError(f"at most {MAX_AGENTS} agents")
        owners = [a.name for a in self.specs.values() if a.owns_kernel]
        if len(owners) > 1:
            raise ValueError(f"only one agent may own the kernel, not {owners}")
        if etcd_members not in MEMBER_COUNTS:
            raise ValueError(f"etcd members: {etcd_members}; one of {', '.join(map(str, MEMBER_COUNTS))}")
        self.etcd_members = etcd_members
        self.region = region
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self.network: Network | None = None
        self.etcd: EtcdServer | None = None  # the single member's (etcd_members 1)
        self.etcd_servers: dict[str, EtcdServer] = {}  # a cluster's members this process started, by name
        self.controld_listen: str | None = None
        self.procs: dict[str, ProcRef | None] = {}
        self._popen: dict[str, subprocess.Popen] = {}
        self._etcd_info: dict | None = None
        self.stopped = False
        self.partitioned: set[str] = set()  # names cut off by partition(), until heal()

    # persisted state -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        def proc(key: str) -> dict | None:
            ref = self.procs.get(key)
            return {"pid": ref.pid, "create_time": ref.create_time} if ref else None

        net = self.network
        return {
            "version": 1,
            "region": self.region,
            "workdir": str(self.workdir),
            "heartbeat_timeout": self.heartbeat_timeout,
            "stopped": self.stopped,
            "launcher_pid": os.getpid(),
            "controld_args": list(self.controld_args),
            "start_timeout": self.start_timeout,
            "partitioned": sorted(self.partitioned),
            "network": net.to_dict() if net else None,
            "url": self.url if self.controld_listen else None,
            "api_token_file": str(self.api_token_file),
            "bootstrap_token_file": str(self.bootstrap_token_file),
            "etcd_members": self.etcd_members,
            "etcd": {**(self._etcd_info or {}), "proc": proc("etcd")} if self.etcd_members == 1 else
                    {**(self._etcd_info or {}), "procs": {n: proc(n) for n in self.etcd_names()}},
            "controld": {"listen": self.controld_listen, "log": str(self.log_path("controld")), "proc": proc("controld")},
            "agents": {
                name: {
                    "spec": asdict(spec),
                    "machine_id": f"{net.prefix}-{name}" if net and net.prefix else None,
                    "netns": f"{net.prefix}-{name}" if net and net.prefix else None,
                    "ip": net.namespaces[name].ip if net and name in net.namespaces else None,
                    "listen": AGENT_LISTEN,
                    "state_dir": str(self.state_dir(name)),
                    "log": str(self.log_path(name)),
                    "proc": proc(f"agent:{name}"),
                }
                for name, spec in self.specs.items()
            },
        }

    def save(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, self.state_file)

    @classmethod
    def from_dir(cls, workdir: str | Path) -> Region:
        """The region recorded in `workdir/region.json` (e.g. by `up` in another process)."""
        workdir = Path(workdir).resolve()
        d = json.loads((workdir / STATE_FILE).read_text())
        r = cls(workdir, [AgentSpec(**a["spec"]) for a in d["agents"].values()], region=d["region"],
                heartbeat_timeout=d["heartbeat_timeout"], controld_args=tuple(d.get("controld_args", ())),
                start_timeout=d.get("start_timeout", 60.0), etcd_members=d.get("etcd_members", 1))
        r.stopped = d.get("stopped", False)
        r.partitioned = set(d.get("partitioned", ()))
        if d.get("network"):
            r.network = Network.from_dict(d["network"])
        r.controld_listen = d["controld"]["listen"]
        etcd = dict(d.get("etcd") or {})
        p = etcd.pop("proc", None)
        for name, p_ in (etcd.pop("procs", None) or {"etcd": p}).items():
            r.procs[name] = ProcRef(**p_) if p_ else None
        r._etcd_info = etcd or None
        p = d["controld"].get("proc")
        r.procs["controld"] = ProcRef(**p) if p else None
        for name, a in d["agents"].items():
            r.procs[f"agent:{name}"] = ProcRef(**a["proc"]) if a.get("proc") else None
        return r

    # start ---------------------------------------------------------------------------------
    def start(self) -> Region:
        if self.state_file.exists():
            old = Region.from_dir(self.workdir)
            live = [k for k, ref in old.procs.items() if ref and ref.alive()]
            if live or (old.network and any(old.network.leftovers().values())):
                raise RuntimeError(f"a region is still running from {self.workdir} ({', '.join(live) or 'network'}): "
                                   f"stop it first (python -m controlplane.devregion down --dir {self.workdir})")
        self.stopped = False
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(exist_ok=True)
            self.save()
            self.network = Network(on_change=lambda _n: self.save())
            self.network.create()
            for name in self.specs:
                self.network.add_namespace(name)
            self._make_pki()
            self._start_etcd()
            _write_secret(self.api_token_file, secrets.token_hex(32))  # hex: never a leading "-" (a flag to a CLI)
            _write_secret(self.bootstrap_token_file, secrets.token_hex(32))
            _write_secret(self.secret_key_file, Sealer.new_key_line("key1"))  # secret task values sealed in etcd
            self.controld_listen = f"{self.network.bridge_ip}:{_port_on(self.network.bridge_ip, CONTROLD_PORT)}"
            self.save()
            self.start_controld()
            for name in self.specs:
                self._spawn_agent(name)
            self._wait_agents(list(self.specs))
            return self
        except BaseException as e:
            problems = self.stop()
            if problems:
                log.warning("teardown after a failed start: %s", "; ".join(problems))
                if isinstance(e, Exception):
                    e.add_note("teardown after the failed start: " + "; ".join(problems))
            raise

    # commands (separate methods so tests can stand in for the processes) ----------------------
    def controld_command(self) -> list[str]:
        assert self._etcd_info is not None and self.controld_listen is not None
        return [
            sys.executable, "-m", "controlplane.daemon",
            "--etcd", ",".join(self.etcd_endpoints()), "--region", self.region, "--listen", self.controld_listen,
            "--api-token-file", str(self.api_token_file), "--bootstrap-token-file", str(self.bootstrap_token_file),
            "--secret-key-file", str(self.secret_key_file), "--heartbeat-timeout", f"{self.heartbeat_timeout:g}", "--log-level", "info",
            "--tls-cert", self._pki("controld")[0], "--tls-key", self._pki("controld")[1], "--tls-ca", str(self.ca_file),
            "--etcd-ca", str(self.ca_file), "--etcd-cert", self._pki(ETCD_USER)[0],
            "--etcd-key", self._pki(ETCD_USER)[1], *self.controld_args,
        ]

    def agent_command(self, name: str) -> list[str]:
        """The agent's command line (run inside its namespace with `ip netns exec`)."""
        s = self._spec(name)
        cmd = [
            sys.executable, "-m", "agent", "--config", str(self._agent_config(name)),
            "--state-dir", str(self.state_dir(name)), "run",
            "--control-plane", self.url, "--bootstrap-token-file", str(self.bootstrap_token_file),
            "--control-plane-ca", str(self.ca_file),
            "--machine-id", self.machine_id(name), "--region", self.region, "--dc", s.dc, "--msb", s.msb,
            "--rack", s.rack, "--machine-type", s.machine_type, "--cpus", f"{s.cpus:g}", "--memory-mb", str(s.memory_mb),
            "--listen", AGENT_LISTEN, "--address", self.agent_ip(name), "--image-pull", "never",
            "--reconcile-interval", "0.5",
        ]
        if not s.owns_kernel:
            cmd.append("--no-kernel")
        return cmd

    def _agent_config(self, name: str) -> Path:
        """The agent's config file: the region's own, so that a host /etc/twine/agent.toml never
        applies; it says only whether the agent owns the kernel (so `profile rollback` agrees with
        `run --no-kernel`). Everything else comes from flags."""
        path = self.agent_dir(name) / "agent.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        owns = "true" if self._spec(name).owns_kernel else "false"
        text = f"# twine dev region agent {name}: the rest comes from flags\nowns_kernel = {owns}\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return path

    def netns_command(self, name: str, argv: list[str]) -> list[str]:
        """`ip netns exec`: the namespace's network, and a mount namespace of its own (slave to the
        host's: nothing mounted there comes back) whose /sys is mounted afresh, for the namespace's
        network devices, without the host's cgroup hierarchies (with_cgroups mounts them again)."""
        return [ip_binary(), "netns", "exec", self.netns(name), *argv]

    def netns_exec(self, name: str, *argv: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run a command inside agent `name`'s network namespace."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        check = kw.pop("check", False)
        return subprocess.run(self.netns_command(name, list(argv)), check=check, timeout=timeout, env=child_env(), cwd=REPO, **kw)

    # controld ------------------------------------------------------------------------------
    def start_controld(self, wait: bool = True) -> None:
        ref = self.procs.get("controld")
        if ref is not None and ref.alive():
            raise RuntimeError(f"controld is already running (pid {ref.pid})")
        popen, ref = spawn(self.controld_command(), self.log_path("controld"))
        self._popen["controld"], self.procs["controld"] = popen, ref
        self.save()
        if wait:
            self.wait_controld()

    def wait_controld(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last: object = None
        opener = self.opener()  # the CA read once, not every try
        while time.monotonic() < deadline:
            self._check_running("controld")
            try:
                with opener.open(f"{self.url}/v1/openapi.json", timeout=2) as r:
                    if r.status == 200:
                        return
                    last = r.status
            except (OSError, urllib.error.HTTPError) as e:
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"controld did not answer on {self.url} in time (last: {last})\n{log_tail(self.log_path('controld'))}")

    def kill_controld(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int | None:
        """Signal controld and wait until it has exited (SIGKILL after `timeout`)."""
        return self._kill("controld", sig, timeout)

    # agents --------------------------------------------------------------------------------
    def _spawn_agent(self, name: str) -> None:
        self.state_dir(name).mkdir(parents=True, exist_ok=True)
        popen, ref = spawn(self.netns_command(name, with_cgroups(self.agent_command(name))), self.log_path(name))
        self._popen[f"agent:{name}"], self.procs[f"agent:{name}"] = popen, ref
        self.save()

    def start_agent(self, name: str, wait: bool = True) -> None:
        ref = self.procs.get(f"agent:{name}")
        if ref is not None and ref.alive():
            raise RuntimeError(f"agent {name} is already running (pid {ref.pid})")
        self._spawn_agent(name)
        if wait:
            self._wait_agents([name])

    def kill_agent(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int | None:
        """Signal agent `name` and wait until it has exited (SIGKILL after `timeout`)."""
        self._spec(name)
        return self._kill(f"agent:{name}", sig, timeout)

    def agent_pid(self, name: str) -> int | None:
        ref = self.procs.get(f"agent:{name}")
        return ref.pid if ref and ref.alive() else None

    def agent_status(self, name: str, timeout: float = 5.0) -> dict:
        """The agent's GET /status, fetched from inside its namespace. Raises OSError when it does
        not answer."""
        host, port = AGENT_LISTEN.rsplit(":", 1)
        status, body = ns_http_get(self.netns(name), host, int(port), "/status", timeout)
        if status != 200:
            raise OSError(f"agent {name}: /status answered {status}: {body[:200]!r}")
        return json.loads(body)

    def _wait_agents(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = list(names)
        last: dict[str, object] = {}
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                self._check_running(f"agent:{name}")
                try:
                    self.agent_status(name, timeout=2)
                    waiting.remove(name)
                except (OSError, ValueError) as e:
                    last[name] = e
            if waiting:
                time.sleep(0.1)
        if waiting:
            tails = "\n".join(f"--- agent {n}:\n{log_tail(self.log_path(n), 1500)}" for n in waiting)
            raise RuntimeError(f"agents {waiting} did not answer /status in time (last: {last})\n{tails}")

    def _check_running(self, key: str) -> None:
        popen, ref = self._popen.get(key), self.procs.get(key)
        code = popen.poll() if popen is not None else None
        if (popen is not None and code is not None) or ref is None or not ref.alive():
            what = key.split(":", 1)[-1]
            path = self.log_path(what)
            raise RuntimeError(f"{key} exited{f' with {code}' if code is not None else ''}; log {path}:\n{log_tail(path)}")

    def _kill(self, key: str, sig: int, timeout: float) -> int | None:
        ref = self.procs.get(key)
        if ref is None:
            return None
        code = stop_process(ref, self._popen.pop(key, None), sig=sig, timeout=timeout)
        self.procs[key] = None
        self.save()
        return code

    # tools ---------------------------------------------------------------------------------
    def twinectl(self, *args: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run `twinectl --url URL --ca CA --token-file F ARGS...` (output captured as text)."""
        return subprocess.run(  # noqa: PLW1510 - the caller looks at returncode
            [sys.executable, "-m", "controlplane.cli.twinectl", "--url", self.url, "--ca", str(self.ca_file),
             "--token-file", str(self.api_token_file), *args],
            input=input, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=REPO,
        )

    def containers(self, job: str | None = None) -> list[dict]:
        """The Docker containers of this region's machines (running or not), with their labels."""
        client = _docker()
        out = []
        for name in self.specs:
            filters = [f"{MACHINE_LABEL}={self.machine_id(name)}"]
            if job is not None:
                filters.append(f"{JOB_LABEL}={job}")
            for c in client.containers.list(all=True, filters={"label": filters}, ignore_removed=True):
                out.append({"id": c.id, "name": c.name, "status": c.status, "agent": name,
                            "machine": self.machine_id(name), "job": c.labels.get(JOB_LABEL), "labels": dict(c.labels)})
        return out

    # stop ----------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Tear down everything this region started; returns the problems met (empty: clean)."""
        problems: list[str] = []

        def attempt(what: str, fn: Callable[[], object]) -> None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep tearing down
                problems.append(f"{what}: {type(e).__name__}: {e}")

        if self.partitioned:
            attempt("heal", lambda: problems.extend(self.heal()))
        # agents: SIGTERM to all at once, then wait (SIGKILL after 10 s)
        agent_keys = [k for k in self.procs if k.startswith("agent:") and self.procs[k] is not None]
        for key in agent_keys:
            p = self.procs[key].process()
            if p is not None:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGTERM)
        for key in agent_keys:
            attempt(f"stop {key}", lambda key=key: self._kill(key, signal.SIGTERM, 10.0))
        if self.procs.get("controld") is not None:
            attempt("stop controld", lambda: self._kill("controld", signal.SIGTERM, 10.0))
        # hand the kernel back, then the containers
        for name in self.specs:
            if (self.state_dir(name) / PROFILE_APPLIED).exists():
                attempt(f"profile rollback of {name}", lambda name=name: self._rollback(name))
        if self.network is not None and self.network.prefix is not None:
            attempt("remove containers", self._remove_containers)
            attempt("network teardown", lambda: problems.extend(self.network.destroy()))
        attempt("stop etcd", lambda: self._stop_etcd(attempt))
        self.stopped = True
        if self.workdir.exists():
            attempt("save region.json", self.save)
        return problems

    def _rollback(self, name: str) -> None:
        argv = [sys.executable, "-m", "agent", "--config", str(self._agent_config(name)),
                "--state-dir", str(self.state_dir(name)), "profile", "rollback"]
        if self.network is not None and self.netns(name) in self.network.leftovers()["netns"]:
            argv = self.netns_command(name, argv)
        r = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO)
        with open(self.log_path(name), "a") as f:
            f.write(f"\n=== profile rollback (exit {r.returncode})\n{r.stdout}{r.stderr}")
        if r.returncode != 0:
            raise RuntimeError(f"exit {r.returncode}: {(r.stderr or r.stdout)[-1000:]}")

    def _remove_containers(self) -> None:
        try:
            client = _docker()
        except Exception as e:
            if any((self.state_dir(n)).exists() for n in self.specs):
                raise RuntimeError(f"docker is not reachable, containers of this region may be left: {e}") from e
            return
        for name in self.specs:
            for c in client.containers.list(all=True, filters={"label": f"{MACHINE_LABEL}={self.machine_id(name)}"},
                                                ignore_removed=True):
                c.remove(force=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        problems = self.stop()
        if problems:
            log.warning("region teardown: %s", "; ".join(problems))


def sweep_orphans(min_age: float = 600.0, only: Collection[str] | None = None) -> list[str]:
    """Remove what regions whose process was killed before its teardown left on this host (their
    namespaces, links and task containers: network.orphaned_prefixes()). Returns what was removed."""
    prefixes = orphaned_prefixes(min_age, only)
    removed: list[str] = []
    if not prefixes:
        return removed
    try:
        client = _docker()
        containers = client.containers.list(all=True, filters={"label": MACHINE_LABEL}, ignore_removed=True)
    except Exception as e:  # noqa: BLE001 - no Docker: the namespaces still go
        log.warning("orphaned regions %s: their containers not looked for: %s", prefixes, e)
        containers = []
    for c in containers:
        if c.labels.get(MACHINE_LABEL, "").partition("-")[0] in prefixes:
            c.remove(force=True)
            removed.append(f"container {c.name}")
    for prefix in prefixes:
        Network(prefix).destroy()
        removed.append(f"network {prefix}")
    return removed


def _docker():
    import docker

    client = docker.from_env(version="auto")
    client.ping()
    return client


def _port_on(host: str, preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will (TIME_WAIT is no obstacle)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port on {host}")
