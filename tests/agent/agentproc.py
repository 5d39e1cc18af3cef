"""Runs a real `twine-agent run` process for tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProc:
    def __init__(self, tmp: Path, machine_id: str, desired: Path, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.tmp, self.machine_id, self.desired = tmp, machine_id, desired
        self.env = env or {}
        self.state = tmp / "state"
        self.port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "agent.log"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "agent",
            "--state-dir", str(self.state), "run", "--desired", str(self.desired),
            "--listen", f"127.0.0.1:{self.port}", "--machine-id", self.machine_id, "--image-pull", "never",
            "--reconcile-interval", "0.5", *self.extra,
        ]

    def start(self, wait: bool = True) -> "AgentProc":
        env = {**os.environ, "PYTHONPATH": str(REPO), **self.env}
        self.proc = subprocess.Popen(self.command(), stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
        if wait:
            self.wait_for(lambda s: True, what="agent to answer")
        return self

    def run_to_exit(self, timeout: float = 30) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(self.command(), capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as r:
            return json.loads(r.read())

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_for(self, predicate, timeout: float = 30, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                s = self.status()
                last = s
                if predicate(s):
                    return s
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last: {last}\nlog: {self.log.read_text()[-2000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
