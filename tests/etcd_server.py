"""A real etcd (Debian's etcd-server) on free loopback ports with a temporary data dir."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    def __init__(self) -> None:
        self.port = _free_port()
        self.peer_port = _free_port()
        self.data_dir = tempfile.mkdtemp(prefix="twine-etcd-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "EtcdServer":
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer_port}"
        self.proc = subprocess.Popen(
            [
                "etcd", "--name", "test", "--data-dir", self.data_dir,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}", "--log-level", "error", "--logger", "zap",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not become healthy in 20 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
