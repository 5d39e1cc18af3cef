"""A real irqbalance daemon beside IRQ pinning on the real kernel: the profile refuses to pin
while it runs (naming the fix), and verify names it when it has moved a pinned IRQ back."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.profiles.appliers.base import HostContext
from agent.profiles.engine import Engine
from agent.profiles.model import Outcome

pytestmark = pytest.mark.host
IRQ_FILES = sorted(Path("/proc/irq").glob("*/smp_affinity_list"), key=lambda p: int(p.parent.name))


def movable_irqs() -> list[int]:
    """IRQs that the kernel lets us move between CPU 0 and CPU 1 (not the managed ones)."""
    out = []
    for f in IRQ_FILES:
        n = int(f.parent.name)
        if n in (0, 2):
            continue
        before = f.read_text().strip()
        try:
            f.write_text(before)
        except OSError:
            continue
        out.append(n)
    return out


@pytest.fixture
def irqs(host_files):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("needs two CPUs to move interrupts between")
    host_files.save(*IRQ_FILES)
    found = movable_irqs()
    if len(found) < 4:
        pytest.fail(f"needs four movable IRQs; found {found}")
    return found


@pytest.fixture
def irqbalance():
    exe = shutil.which("irqbalance")
    assert exe, "irqbalance is not installed (scripts/setup.sh installs Debian's irqbalance)"
    procs = []

    def start() -> subprocess.Popen:
        p = subprocess.Popen([exe, "--foreground", "--interval", "1"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        procs.append(p)
        time.sleep(0.3)
        assert p.poll() is None, "irqbalance exited at once"
        return p

    yield start
    for p in procs:  # stopped before host_files puts every IRQ back
        p.terminate()
        p.wait(10)


def test_pinning_is_refused_while_irqbalance_runs_and_verify_names_it_when_it_moves_an_irq(
        irqs, irqbalance, tmp_path):
    (tmp_path / "pin.toml").write_text(
        '[sysctl]\n"vm.swappiness" = 33\n[irq_affinity]\n'
        f"pinned = {{ match = '{_names_regex(irqs)}', cpus = \"0\" }}\n")
    engine = Engine(HostContext(), tmp_path / "state", search=(tmp_path,))
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    try:
        daemon = irqbalance()
        report = engine.apply("pin")
        assert not report.ok and "irqbalance is running" in report.error
        assert "[irqbalance] running = false" in report.error
        assert Path("/proc/sys/vm/swappiness").read_text() == swappiness, "the sysctl was not rolled back"
        assert engine.current() is None
        daemon.terminate()
        daemon.wait(10)

        report = engine.apply("pin")
        assert report.ok, report.error
        pinned = [r for r in report.results if r.setting_id.startswith("irq_affinity:")]
        assert pinned and pinned[0].outcome in (Outcome.APPLIED, Outcome.HELD)

        irqbalance()  # it comes back (a package upgrade, an operator) and spreads the IRQs again
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            verify = engine.verify()
            if not verify.ok:
                break
            time.sleep(0.5)
        assert not verify.ok, "irqbalance moved no pinned IRQ in 30 s"
        assert "irqbalance is running" in verify.failed()[0].reason
    finally:
        engine.rollback()


def _names_regex(irqs: list[int]) -> str:
    """A regex over /proc/interrupts names that matches exactly these IRQs' action names."""
    import re

    from agent.profiles.appliers.irq_affinity import IrqAffinity

    found = IrqAffinity(HostContext())._interrupts()
    return "|".join(f"^{re.escape(found[n][0])}$" for n in irqs if n in found)
