"""irqbalance, the daemon that spreads interrupts over CPUs every 10 s: a profile that pins IRQs
([irq_affinity]) must hold it off, or it silently moves them back.

    [irqbalance]
    running = false   # stopped while the profile is applied; started again when it is rolled back

Switched through systemd (`systemctl stop|start irqbalance.service`), which owns the daemon on
Debian and Ubuntu hosts. Without systemd as PID 1 there is nothing to switch it with: not
applicable (and [irq_affinity] refuses to pin IRQs while an irqbalance process runs).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Mapping

import psutil

from agent.errors import ProfileError
from agent.profiles.appliers.base import Applier, ApplierError
from agent.profiles.model import NotApplicable, Setting
from agent.sdnotify import systemd_is_pid1

UNIT = "irqbalance.service"


def irqbalance_pids() -> list[int]:
    """PIDs of running irqbalance daemons (any, systemd's or not)."""
    pids = []
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == "irqbalance":
            pids.append(p.pid)
    return pids


class Irqbalance(Applier):
    name = "irqbalance"
    order = 45  # before [irq_affinity] (50): stopped before IRQs are pinned, started after they are restored

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        settings = []
        for key, value in section.items():
            if key != "running":
                raise ProfileError(origin, f"[irqbalance] {key}", value, "unknown key; the only key is `running`")
            if not isinstance(value, bool):
                raise ProfileError(origin, "[irqbalance] running", value, "must be true or false")
            settings.append(Setting(self.name, key, value, origin))
        return settings

    def applicable(self, key: str) -> NotApplicable | None:
        if not systemd_is_pid1(self.ctx.proc):
            return NotApplicable("systemd is not PID 1: no service manager to stop and start irqbalance with")
        if not Path("/usr/sbin/irqbalance").exists() and not irqbalance_pids():
            return NotApplicable("irqbalance is not installed")
        return None

    def read(self, key: str) -> bool:
        return bool(irqbalance_pids())

    def write(self, key: str, value: bool) -> None:
        verb = "start" if value else "stop"
        r = subprocess.run(["systemctl", verb, UNIT], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ApplierError(f"systemctl {verb} {UNIT}: {r.stderr.strip() or f'exit {r.returncode}'}")
        if not value:
            left = irqbalance_pids()
            if left:
                raise ApplierError(f"irqbalance still runs outside {UNIT} (pid {', '.join(map(str, left))}): stop it by hand")


APPLIER = Irqbalance
