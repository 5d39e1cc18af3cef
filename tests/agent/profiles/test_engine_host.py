"""A whole profile across appliers on the real kernel: sysctls, hugepages and IRQ affinity really
change, a rollback restores every original, and a failure in a late applier undoes the earlier ones."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from agent.profiles.appliers.base import HostContext
from agent.profiles.appliers.irq_affinity import IrqAffinity
from agent.profiles.engine import Engine
from agent.profiles.model import Outcome
from tests.conftest import missing_part, sysctl_path

pytestmark = pytest.mark.host
NR_2M = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")


def irqs(pattern: str) -> list[tuple[int, str]]:
    found = IrqAffinity(HostContext())._interrupts()
    return [(n, names) for n, (_, names, _) in found.items() if re.search(pattern, names)]


def affinity(n: int) -> str:
    return Path(f"/proc/irq/{n}/smp_affinity_list").read_text().strip()


@pytest.fixture
def host(host_files, tmp_path):
    queue = irqs(r"virtio\d+-(input|output)\.\d+|(eth|ens|enp)\w*-(rx|tx|TxRx)-\d+")
    host_files.save(sysctl_path("vm.swappiness"), sysctl_path("net.core.somaxconn"), NR_2M)
    host_files.save(*(Path(f"/proc/irq/{n}/smp_affinity_list") for n, _ in queue))
    engine = Engine(HostContext(), tmp_path / "state", search=(tmp_path,))
    yield engine, queue
    engine.rollback()


def snapshot(queue) -> dict:
    return {
        "swappiness": sysctl_path("vm.swappiness").read_text(),
        "somaxconn": sysctl_path("net.core.somaxconn").read_text(),
        "hugepages": NR_2M.read_text(),
        **{f"irq{n}": affinity(n) for n, _ in queue},
    }


def test_profile_changes_sysctls_hugepages_and_irq_affinity_and_rollback_restores_all(host, tmp_path):
    engine, queue = host
    if not queue:
        missing_part("no NIC queue interrupt on this host")
    n, names = queue[0]
    # pinned to a CPU other than its list's, where it is delivered now: the kernel moves it at
    # once; a move to another CPU waits until the IRQ fires and can be given up then (seen on CI)
    delivered = Path(f"/proc/irq/{n}/effective_affinity_list").read_text().strip().split(",")[0].split("-")[0]
    target = delivered if affinity(n) != delivered else ("1" if delivered == "0" else "0")
    before = snapshot(queue)
    pages = 16 if NR_2M.read_text().strip() != "16" else 24
    (tmp_path / "all.toml").write_text(textwrap.dedent(f"""
        [sysctl]
        "vm.swappiness" = 31
        [hugepages]
        "2M" = {pages}
        [irq_affinity]
        queue = {{ match = '^{re.escape(names)}$', cpus = "{target}" }}
    """))
    report = engine.apply("all")
    assert report.ok, report.error
    assert {r.outcome for r in report.results} == {Outcome.APPLIED}
    assert sysctl_path("vm.swappiness").read_text().strip() == "31"
    assert NR_2M.read_text().strip() == str(pages)
    assert affinity(n) == target
    print(f"switch took {report.seconds * 1000:.1f} ms: " + ", ".join(f"{r.setting_id.split('=')[0]} {r.seconds * 1000:.2f} ms" for r in report.results))

    assert engine.rollback().ok
    assert snapshot(queue) == before


def test_failure_in_a_late_applier_rolls_back_the_earlier_ones(host, tmp_path):
    """Managed interrupts (a virtio block queue here) cannot be moved: the kernel says EPERM/EIO.
    By then the sysctl and hugepages appliers (which run first) have written for real."""
    engine, queue = host
    managed = irqs(r"virtio\d+-req\.\d+|nvme\d+q\d+")
    if not managed:
        missing_part("no managed interrupt on this host")
    n, names = managed[0]
    Path(f"/proc/irq/{n}/smp_affinity_list").read_text()  # saved below, in case it is not managed
    before = snapshot(queue)
    other = "0" if affinity(n) != "0" else "1"
    (tmp_path / "bad.toml").write_text(textwrap.dedent(f"""
        [sysctl]
        "vm.swappiness" = 31
        "net.core.somaxconn" = 1111
        [hugepages]
        "2M" = 8
        [irq_affinity]
        blk = {{ match = '^{re.escape(names)}$', cpus = "{other}" }}
    """))
    original_irq = affinity(n)
    report = engine.apply("bad")
    if report.ok:  # this host let us move it after all: put it back and say so
        Path(f"/proc/irq/{n}/smp_affinity_list").write_text(original_irq)
        engine.rollback()
        missing_part(f"IRQ {n} ({names}) is not managed here")
    outcomes = {r.setting_id.split("=")[0]: r.outcome for r in report.results}
    assert outcomes["irq_affinity:blk"] is Outcome.FAILED
    assert outcomes["sysctl:vm.swappiness"] is Outcome.ROLLED_BACK
    assert outcomes["hugepages:2M"] is Outcome.ROLLED_BACK
    assert f"IRQ {n}" in report.error
    assert snapshot(queue) == before and affinity(n) == original_irq
    assert engine.current() is None


def test_a_record_or_journal_from_another_boot_is_dropped_not_undone(host, tmp_path):
    import json

    engine, _ = host
    (tmp_path / "p.toml").write_text('[sysctl]\n"vm.swappiness" = 41\n')
    assert engine.forget_previous_boot() is None  # nothing applied: nothing to forget
    assert engine.apply("p").ok
    assert engine.forget_previous_boot() is None, "the same boot is not a reboot"
    assert engine.current() is not None

    # A switch that died half-way, then a reboot: the journal's undo belongs to the old kernel.
    record = json.loads((tmp_path / "state" / "profile-applied.json").read_text())
    record["boot_id"] = "another-boot"
    (tmp_path / "state" / "profile-applied.json").write_text(json.dumps(record))
    (tmp_path / "state" / "profile-journal.json").write_text(json.dumps(
        {"target": "p", "previous": None, "boot_id": "another-boot",
         "undo": [{"applier": "sysctl", "key": "vm.swappiness", "value": 5}]}))
    sysctl_path("vm.swappiness").write_text("29")  # the new boot's value
    assert engine.forget_previous_boot() == "p"
    assert engine.current() is None and engine.recover() is None
    assert sysctl_path("vm.swappiness").read_text().strip() == "29", "a journal of the last boot was undone"
