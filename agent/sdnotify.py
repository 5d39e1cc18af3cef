"""systemd's service notification protocol: READY, STATUS and the watchdog, for both daemons.

Under `Type=notify` systemd counts a daemon as started only once it says READY=1; with
`WatchdogSec=` it restarts a daemon whose pings stop. The pings come from the daemon's own event
loop (`watchdog_loop` runs as one of its tasks), so a hung loop is a restarted daemon. Outside
systemd (no NOTIFY_SOCKET) every call does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from pathlib import Path

from systemd_watchdog import WatchDog

log = logging.getLogger("twine.sdnotify")


class Notifier:
    def __init__(self) -> None:
        self._wd = WatchDog()

    @property
    def enabled(self) -> bool:
        return self._wd.is_enabled

    def watchdog_seconds(self) -> float | None:
        """systemd's watchdog timeout for this process, or None when it has none."""
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        if not self.enabled or not usec.isdigit() or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 1e6

    def ready(self, status: str = "") -> None:
        if status:
            self._wd.status(status)
        self._wd.ready()

    async def watchdog_loop(self) -> None:
        """Ping systemd at a quarter of its timeout for as long as this event loop runs."""
        timeout = self.watchdog_seconds()
        if timeout is None:
            return
        log.info("systemd watchdog: %.0f s; pinging every %.1f s", timeout, timeout / 4)
        while True:
            self._wd.notify()
            await asyncio.sleep(timeout / 4)


def systemd_is_pid1(proc: Path = Path("/proc")) -> bool:
    """systemd runs this host (not a container's init or a plain shell)."""
    try:
        return (proc / "1" / "comm").read_text().strip() == "systemd"
    except OSError:
        return False


def host_rebooting() -> bool:
    """systemd is taking the host down for a reboot (not a restart of this service, not a
    power-off): a reboot or kexec target is among its queued jobs."""
    if not systemd_is_pid1():
        return False
    try:
        jobs = subprocess.run(["systemctl", "list-jobs", "--no-legend", "--no-pager"], capture_output=True,
                              text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.split()[1:2] in (["reboot.target"], ["kexec.target"]) for line in jobs.splitlines())
