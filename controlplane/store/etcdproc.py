"""A real etcd (Debian's `etcd`) on free loopback ports with its own data dir, or a cluster of them.

Used by the tests (`tests/etcd_server.py` re-exports it) and by the local dev region
(`controlplane/devregion/`). The data dir belongs to the server: `stop()` removes it.

An EtcdCluster is 3 (or 5) members of one etcd cluster, each an EtcdServer on a loopback address
of its own (127.0.0.11, .12, ...: a member can be cut off by its address alone), speaking TLS to
its peers when given certificates, as a replicated store runs in production.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from controlplane.store.etcd import ETCD_COMPACTION, ETCD_FLAGS


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EtcdServer:
    """`EtcdServer().start()` ... `.stop()`; clients use `host:port` (`.endpoint`). `halt()` and
    `start()` again: the same etcd, down for a while."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        data_dir: str | Path | None = None,
        log_file: str | Path | None = None,
        log_level: str = "error",
        new_session: bool = False,
        name: str = "test",
        raised_limits: bool = True,
        extra_flags: tuple[str, ...] = (),
        tls: tuple[str | Path, str | Path, str | Path] | None = None,
        peer_tls: tuple[str | Path, str | Path, str | Path] | None = None,
        cgroup: str | Path | None = None,
    ) -> None:
        # (cert, key, ca): clients speak TLS and must show a certificate the CA signed
        self.tls = tuple(map(str, tls)) if tls is not None else None
        # the same for the other members of its cluster (EtcdCluster)
        self.peer_tls = tuple(map(str, peer_tls)) if peer_tls is not None else None
        self.initial_cluster: str | None = None  # name=peer URL,...: its cluster's members (None: itself alone)
        self.initial_state = "new"  # "existing": a member joining a running cluster (members.py add)
        # a cgroup (v2 directory) the process runs in from its start: every socket it makes belongs to
        # it, so that iptables can cut off exactly this member (`-m cgroup --path`)
        self.cgroup = str(cgroup) if cgroup is not None else None
        self.cluster_token = "twine"
        self.extra_flags = tuple(extra_flags)  # more etcd flags (a benchmark's larger backend quota)
        self.raised_limits = raised_limits  # False: etcd's default limits (128 operations a transaction)
        self.host = host
        self.port = free_port(host)
        self.peer_port = free_port(host)
        # ours to change if another process takes one before etcd first binds it (None once started)
        self._chosen_ports: tuple[int, int] | None = (self.port, self.peer_port)
        self._made_dir = data_dir is None  # a data dir of its own: removed when a start fails too
        if data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="twine-etcd-")
        else:
            self.data_dir = str(data_dir)
            os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        self.log_file = Path(log_file) if log_file is not None else None
        self.log_level = log_level
        self.new_session = new_session
        self.name = name
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"{'https' if self.peer_tls else 'http'}://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        client, peer = self.url, self.peer_url
        return [
            "etcd", "--name", self.name, "--data-dir", self.data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster or f"{self.name}={peer}",
            "--initial-cluster-token", self.cluster_token, "--initial-cluster-state", self.initial_state,
            "--log-level", self.log_level, "--logger", "zap",
            *(ETCD_FLAGS if self.raised_limits else ETCD_COMPACTION), *self.extra_flags,
            *(("--cert-file", self.tls[0], "--key-file", self.tls[1], "--trusted-ca-file", self.tls[2],
                "--client-cert-auth") if self.tls else ()),
            *(("--peer-cert-file", self.peer_tls[0], "--peer-key-file", self.peer_tls[1],
               "--peer-trusted-ca-file", self.peer_tls[2], "--peer-client-cert-auth") if self.peer_tls else ()),
        ]

    def _opener(self) -> urllib.request.OpenerDirector:
        if self.tls is None:
            return _NO_PROXY
        ctx = ssl.create_default_context(cafile=self.tls[2])
        ctx.load_cert_chain(self.tls[0], self.tls[1])  # etcd's own certificate serves as a client's too
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))

    def start(self, timeout: float = 20.0) -> EtcdServer:
        """Start and wait until healthy. A port chosen here (free when chosen, then taken by
        another process's connection before etcd bound it) is chosen again, twice at most;
        ports set by the caller (a region's etcd restarted where it was) are kept."""
        for attempt in range(3):
            try:
                started = self._start(timeout)
                self._chosen_ports = None  # started: a later start (after halt) is the same etcd, where it was
                return started
            except RuntimeError as e:
                ours = (self.port, self.peer_port) == self._chosen_ports
                if attempt == 2 or not ours or "address already in use" not in str(e):
                    raise
                self.port, self.peer_port = free_port(self.host), free_port(self.host)
                self._chosen_ports = (self.port, self.peer_port)
                if self._made_dir:  # removed when etcd exited: made again, empty
                    os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> EtcdServer:
        self.launch()
        return self.wait_healthy(timeout)

    def launch(self) -> None:
        """The process, without waiting for it: a cluster's members are launched together (none is
        healthy before a quorum runs)."""
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") if self.log_file is not None else contextlib.nullcontext(subprocess.PIPE) as out:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out,
                start_new_session=self.new_session, preexec_fn=self._join_cgroup if self.cgroup else None,
            )

    def _join_cgroup(self) -> None:
        """In the child, before etcd runs: into its cgroup (made if needed)."""
        os.makedirs(self.cgroup, exist_ok=True)
        with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
            f.write("0")

    def wait_healthy(self, timeout: float) -> EtcdServer:
        """Until /health says true (for a cluster's member: a leader is elected and it follows)."""
        deadline = time.monotonic() + timeout
        opener = self._opener()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                why = f"etcd exited with {self.proc.returncode}: {self._stderr_tail()}"
                if self._made_dir and self._chosen_ports is not None:
                    # never started: a data dir of its own holds nothing (start() may make it again)
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                raise RuntimeError(why)
            try:
                with opener.open(f"{self.url}/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return self
            except OSError:
                time.sleep(0.1)
        # a start that failed keeps a data dir it was given (a region's etcd, restarted: its data)
        self.stop() if self._made_dir else self.halt()
        raise RuntimeError(f"etcd did not become healthy in {timeout:g} s")

    def _stderr_tail(self) -> str:
        if self.log_file is not None:
            try:
                return self.log_file.read_text(errors="replace")[-2000:]
            except OSError:
                return ""
        if self.proc is not None and self.proc.stderr is not None:
            return self.proc.stderr.read().decode(errors="replace")[-2000:]
        return ""

    def halt(self) -> None:
        """Stop the process, keeping its data dir and ports: `start()` brings the same etcd back
        (an outage, a restart)."""
        if self.proc is not None:
            terminate(self.proc)
            if self.proc.stderr is not None:
                self.proc.stderr.close()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def status(self, timeout: float = 2.0) -> dict:
        """Its maintenance status over gRPC: {"member_id", "leader", "revision", "raft_index"}
        (its own certificate as the client's: etcd's JSON gateway refuses certificates once its
        auth is on). OSError when it does not answer."""
        import grpc
        from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

        if self.tls is not None:
            creds = grpc.ssl_channel_credentials(*(Path(f).read_bytes() for f in (self.tls[2], self.tls[1], self.tls[0])))
            channel = grpc.secure_channel(self.endpoint, creds)
        else:
            channel = grpc.insecure_channel(self.endpoint)
        try:
            s = rpc_pb2_grpc.MaintenanceStub(channel).Status(rpc_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise OSError(f"etcd {self.name} at {self.endpoint}: {e.code().name}: {e.details()}") from None
        finally:
            channel.close()
        return {"member_id": s.header.member_id, "leader": s.leader, "revision": s.header.revision,
                "raft_index": s.raftIndex}


class EtcdCluster:
    """`EtcdCluster(3).start()` ... `.stop()`: `n` plain members of one cluster, for tests, member i
    on 127.0.0.1(10+i) with free ports; clients use `.endpoints` (every member's host:port, for
    controld's --etcd). (The dev region runs its own, with TLS and a cgroup a member: devregion/etcd.py.)"""

    def __init__(self, n: int = 3, *, data_root: str | Path | None = None) -> None:
        self._root = None if data_root is not None else tempfile.mkdtemp(prefix="twine-etcd-cluster-")
        root = Path(data_root if data_root is not None else self._root)
        self.members = [EtcdServer(f"127.0.0.{11 + i}", data_dir=root / f"test-{i + 1}", name=f"test-{i + 1}")
                        for i in range(n)]
        self.join()

    def join(self) -> None:
        """Each member told of all (their names and peer URLs)."""
        everyone = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = everyone
            m.cluster_token = self.members[0].name

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        for m in self.members:
            m.launch()
        try:
            for m in self.members:
                m.wait_healthy(timeout)
                m._chosen_ports = None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for m in self.members:
            m.stop()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def leader_of(members: dict[Any, "EtcdServer"], timeout: float = 10.0) -> Any:
    """The key of the member that leads now, of `members` (those running), asking each its
    status, waiting for an election while there is none."""
    deadline = time.monotonic() + timeout
    while True:
        ids: dict[int, Any] = {}
        leader = 0
        for key, m in members.items():
            try:
                s = m.status()
            except (OSError, ValueError):
                continue
            ids[s["member_id"]] = key
            leader = s["leader"] or leader
        if leader in ids:
            return ids[leader]
        if time.monotonic() > deadline:
            raise RuntimeError(f"no leader among the etcd members that answer ({len(ids)} of {len(members)})")
        time.sleep(0.1)


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
    hybrid host), or None."""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    except OSError:
        pass
    return None


def terminate(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM a child we started, SIGKILL it if it has not exited after `timeout`, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
