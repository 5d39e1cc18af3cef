"""Both daemons speak systemd's notify protocol for real: READY once they serve, then watchdog pings
from their event loop, which stop when the process stops running (so systemd restarts it)."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.agent.agentproc import AgentProc
from tests.controlplane.controld_proc import Controld
from tests.procs import freeze


class NotifySocket:
    """What systemd listens on: a datagram socket named in NOTIFY_SOCKET."""

    def __init__(self, path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[tuple[float, str]] = []

    def env(self, watchdog_usec: int) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.path, "WATCHDOG_USEC": str(watchdog_usec)}

    def drain(self, seconds: float) -> list[str]:
        """Every message that arrives within `seconds`."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            got.extend(line for line in data.splitlines() if line)
        self.messages.extend((time.monotonic(), m) for m in got)
        return got

    def wait_for(self, message: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if message in self.drain(0.2):
                return
        raise AssertionError(f"no {message} in {timeout} s; got {[m for _, m in self.messages]}")

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


@pytest.fixture
def notify_socket(tmp_path):
    s = NotifySocket(tmp_path / "notify")
    yield s
    s.close()


def _pings_stop_while_stopped(pid: int, sock: NotifySocket) -> None:
    assert sock.drain(1.5).count("WATCHDOG=1") >= 3, "the watchdog is not pinged every quarter of its timeout"
    freeze(pid)
    try:
        sock.drain(0.3)  # what was already on its way
        assert "WATCHDOG=1" not in sock.drain(1.2), "pings came from a process that does not run"
    finally:
        os.kill(pid, signal.SIGCONT)
    sock.wait_for("WATCHDOG=1", 5)


@pytest.mark.docker
def test_agent_says_ready_once_serving_then_pings_the_watchdog(tmp_path, machine_id, notify_socket):
    desired = tmp_path / "desired.toml"
    desired.write_text("tasks = []\n")
    agent = AgentProc(tmp_path, machine_id, desired, env=notify_socket.env(watchdog_usec=1_000_000))
    try:
        agent.start(wait=False)
        notify_socket.wait_for("READY=1", 30)
        assert agent.get("/healthz")[0] in (200, 503), "READY=1 before the agent serves HTTP"
        assert any(m.startswith("STATUS=machine ") for _, m in notify_socket.messages)
        _pings_stop_while_stopped(agent.proc.pid, notify_socket)
    finally:
        agent.close()


def test_controld_says_ready_once_serving_then_pings_the_watchdog(tmp_path, etcd_server, notify_socket):
    c = Controld(tmp_path, etcd_server.port, env=notify_socket.env(watchdog_usec=1_000_000))
    try:
        c.start()
        notify_socket.wait_for("READY=1", 10)
        assert any(m.startswith("STATUS=region ") for _, m in notify_socket.messages)
        _pings_stop_while_stopped(c.proc.pid, notify_socket)
    finally:
        c.close()
