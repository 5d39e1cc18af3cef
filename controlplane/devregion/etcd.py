"""A dev region's etcd: one member on 127.0.0.1 (the default), or a cluster of 3 or 5 members
(`--etcd-members`), each on a loopback address of its own (127.0.0.11, .12, ...) with TLS to its
clients and its peers, and each in a cgroup of its own so that `partition etcd-N` cuts off exactly
that member (iptables matches its sockets by their cgroup). The Region (region.py) has these as
its own methods."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from controlplane.devregion.layout import ETCD_USER, member_host
from controlplane.devregion.procs import REPO, ProcRef, child_env
from controlplane.store.etcdproc import EtcdServer, cgroup2_root, leader_of

class Etcd:
    """The etcd part of a Region: `etcd_members`, `_etcd_info` (saved with the region's state) and
    the EtcdServer of each member this process knows (`etcd`: the single one; `etcd_servers`)."""

    etcd_members: int
    etcd: EtcdServer | None
    etcd_servers: dict[str, EtcdServer]
    _etcd_info: dict | None

    # -- names ------------------------------------------------------------------------------------

    def etcd_names(self) -> list[str]:
        """The names etcd's processes go by: `etcd`, or `etcd-1` ... `etcd-N`."""
        return ["etcd"] if self.etcd_members == 1 else [f"etcd-{i + 1}" for i in range(self.etcd_members)]

    def etcd_endpoints(self) -> list[str]:
        assert self._etcd_info is not None
        if self.etcd_members == 1:
            return [self._etcd_info["endpoint"]]
        return [f"{m['host']}:{m['port']}" for m in self._etcd_info["members"]]

    def _member(self, name: str) -> dict:
        assert self._etcd_info is not None
        return next(m for m in self._etcd_info["members"] if m["name"] == name)

    def etcd_cgroup(self, name: str) -> str:
        root = cgroup2_root()
        if root is None:
            raise RuntimeError("no cgroup v2 hierarchy is mounted: members of a cluster cannot be cut off one by one")
        return str(root / f"twine-devregion-{self.prefix}-{name}")

    # -- start -------------------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        if self.etcd_members == 1:
            self.etcd = EtcdServer(host="127.0.0.1", data_dir=self.workdir / "etcd", log_file=self.log_path("etcd"),
                                   log_level="warn", new_session=True, name=f"devregion-{self.prefix}",
                                   tls=(*self._pki("etcd"), self.ca_file))
            self._etcd_info = {"endpoint": self.etcd.endpoint, "port": self.etcd.port,
                               "peer_port": self.etcd.peer_port, "data_dir": self.etcd.data_dir,
                               "log": str(self.log_path("etcd"))}
            self.save()
            self.start_etcd()
        else:
            servers = [self._member_server({"name": name, "host": member_host(i + 1)})
                       for i, name in enumerate(self.etcd_names())]
            everyone = ",".join(f"{s.name}={s.peer_url}" for s in servers)
            self._etcd_info = {"members": [
                {"name": name, "host": s.host, "port": s.port, "peer_port": s.peer_port, "data_dir": s.data_dir,
                 "log": str(self.log_path(name)), "cgroup": s.cgroup} for name, s in zip(self.etcd_names(), servers)],
                "initial_cluster": everyone}
            self.save()
            for name in self.etcd_names():  # together: no member is healthy before a quorum runs
                self._launch_member(name)
            for name in self.etcd_names():
                self._wait_member(name)
        self._etcd_auth()

    def _member_server(self, info: dict) -> EtcdServer:
        name = info["name"]
        s = EtcdServer(host=info["host"], data_dir=info.get("data_dir") or self.workdir / "etcd" / name,
                       log_file=self.log_path(name), log_level="warn", new_session=True,
                       name=f"devregion-{self.prefix}-{name}", tls=(*self._pki(name), self.ca_file),
                       peer_tls=(*self._pki(name), self.ca_file), cgroup=self.etcd_cgroup(name))
        if "port" in info:
            s.port, s.peer_port = info["port"], info["peer_port"]
        if self._etcd_info and "initial_cluster" in self._etcd_info:
            s.initial_cluster = self._etcd_info["initial_cluster"]
        s.cluster_token = f"devregion-{self.prefix}"
        return s

    def _launch_member(self, name: str) -> None:
        s = self.etcd_servers[name] = self._member_server(self._member(name))
        s.launch()
        self._popen[name] = s.proc
        with contextlib.suppress(psutil.NoSuchProcess):
            self.procs[name] = ProcRef.of(s.proc.pid)
        self.save()

    def _wait_member(self, name: str, timeout: float = 30.0) -> None:
        self.etcd_servers[name].wait_healthy(timeout)

    def _etcd_auth(self) -> None:
        """etcd's auth on, as an operator would (`python -m controlplane.security.etcdauth`): controld's
        certificate may read and write the region's keys, any other the CA signed nothing."""
        root_cert, root_key = self._pki("root")
        done = subprocess.run(
            [sys.executable, "-m", "controlplane.security.etcdauth", "--endpoint", self.etcd_endpoints()[0],
             "--ca", str(self.ca_file), "--cert", root_cert, "--key", root_key, "--user", ETCD_USER],
            capture_output=True, text=True, timeout=60, env=child_env(), cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"etcd's auth could not be set up: {done.stderr.strip()[-500:]}")

    def start_etcd(self, name: str = "etcd") -> None:
        """Start the region's etcd, or one member of it (`etcd-N`), at region start or again after
        a kill (same data dir, same ports: an outage over), also from another process than the one
        that started it. `etcd` in a cluster: every member that is not running."""
        if self.etcd_members > 1:
            names = [n for n in self.etcd_names() if not (self.procs.get(n) and self.procs[n].alive())] \
                if name == "etcd" else [name]
            for n in names:
                self._launch_member(n)
            for n in names:
                self._wait_member(n)
            return
        if self.etcd is None:
            if not self._etcd_info:
                raise RuntimeError("the region's etcd was never started")
            info = self._etcd_info
            self.etcd = EtcdServer(host=info["endpoint"].rsplit(":", 1)[0], data_dir=info["data_dir"],
                                   log_file=info["log"], log_level="warn", new_session=True,
                                   name=f"devregion-{self.prefix}", tls=(*self._pki("etcd"), self.ca_file))
            self.etcd.port, self.etcd.peer_port = info["port"], info["peer_port"]
        try:
            self.etcd.start()
        finally:
            if self.etcd.proc is not None:
                self._popen["etcd"] = self.etcd.proc
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.procs["etcd"] = ProcRef.of(self.etcd.proc.pid)
                self.save()

    def kill_etcd(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Signal etcd (every member) and wait until it has exited, keeping its data: an etcd outage."""
        codes = [self._kill(n, sig, timeout) for n in self.etcd_names()]
        return codes[0] if len(codes) == 1 else None

    def etcd_leader(self, timeout: float = 10.0) -> str:
        """The member that leads now (`etcd-N`), waiting for an election while there is none."""
        if self.etcd_members == 1:
            return "etcd"
        servers = {n: self.etcd_servers.get(n) or self._member_server(self._member(n)) for n in self.etcd_names()
                   if self.procs.get(n) and self.procs[n].alive()}
        return leader_of(servers, timeout)

    def etcd_status(self, name: str) -> dict:
        """A member's status: {"member_id", "leader", "revision", "raft_index"}."""
        s = self.etcd_servers.get(name) or self._member_server(self._member(name))
        return s.status()

    # -- stop --------------------------------------------------------------------------------------

    def _stop_etcd(self, attempt) -> None:
        for n in self.etcd_names():
            if self.procs.get(n) is not None:
                attempt(f"stop {n}", lambda n=n: self._kill(n, signal.SIGTERM, 10.0))
        for s in [self.etcd, *self.etcd_servers.values()]:
            if s is not None and s.proc is not None and s.proc.stderr is not None:
                s.proc.stderr.close()
        info = self._etcd_info or {}
        if info.get("data_dir"):
            shutil.rmtree(info["data_dir"], ignore_errors=True)
        for m in info.get("members", ()):
            shutil.rmtree(m["data_dir"], ignore_errors=True)
            if m.get("cgroup"):
                with contextlib.suppress(OSError):
                    Path(m["cgroup"]).rmdir()
        if info.get("members"):
            shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
