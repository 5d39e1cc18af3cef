"""The dev region's processes: started in their own session, logged, recorded by PID and start
time (so that another process can stop them), and stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


log = logging.getLogger("twine.devregion")

REPO = Path(__file__).resolve().parents[2]
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


# --------------------------------------------------------------------------------------------
# process helpers


@dataclass(frozen=True)
class ProcRef:
    """A process we started, by PID and start time (so a reused PID is never signalled)."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcRef:
        return cls(pid, psutil.Process(pid).create_time())

    def process(self) -> psutil.Process | None:
        """The process if it is still ours and has not exited, else None."""
        try:
            p = psutil.Process(self.pid)
            if abs(p.create_time() - self.create_time) > 0.01 or p.status() == psutil.STATUS_ZOMBIE:
                return None
            return p
        except psutil.Error:
            return None

    def alive(self) -> bool:
        return self.process() is not None


def child_env(**extra: str) -> dict[str, str]:
    """The environment for processes of the region: the repo importable, and no HTTP proxy (all
    their traffic is local)."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["NO_PROXY"] = env["no_proxy"] = "*"
    env.update(extra)
    return env


def spawn(argv: list[str], log_path: Path, *, env: dict[str, str] | None = None, cwd: Path = REPO) -> tuple[subprocess.Popen, ProcRef]:
    """Start `argv` detached (own session, stdin from /dev/null), stdout+stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env if env is not None else child_env(), cwd=cwd, start_new_session=True,
        )
    try:
        return proc, ProcRef.of(proc.pid)
    except psutil.NoSuchProcess:  # exited (and was reaped) already
        return proc, ProcRef(proc.pid, 0.0)


def stop_process(ref: ProcRef, popen: subprocess.Popen | None = None, *, sig: int = signal.SIGTERM,
                 timeout: float = 10.0) -> int | None:
    """Signal one process we started (by PID, if it is still the same process), wait for it, and
    SIGKILL it after `timeout`. Returns its exit code when known."""
    p = ref.process()
    if p is not None:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)
        if not _wait(ref, popen, timeout) and sig != signal.SIGKILL:
            log.warning("pid %d did not exit %.0f s after signal %d: killing it", ref.pid, timeout, sig)
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
            _wait(ref, popen, 10.0)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return popen.wait(timeout=1)
    return None


def _wait(ref: ProcRef, popen: subprocess.Popen | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None:
            if popen.poll() is not None:
                return True
        elif not ref.alive():
            return True
        time.sleep(0.05)
    return False


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
