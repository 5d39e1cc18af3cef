"""What the agent measures of its tasks and its host (issue #25): real containers under the real
Docker daemon, read from their cgroups as the kernel keeps them (v1 here; v2 in the VM tests)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agent.models import TaskSpec
from agent.runtime.docker_runtime import DockerRuntime
from agent.usage import Running, Sampler, rapl_zones
from tests.conftest import TEST_IMAGE

pytestmark = pytest.mark.docker


def task(job: str, command: tuple[str, ...], cpus: float = 1.0, memory_mb: int = 64) -> TaskSpec:
    return TaskSpec(job=job, index=0, spec_version=1, image=TEST_IMAGE, command=command, cpus=cpus,
                    memory_mb=memory_mb, network_mode="none")


def test_a_task_that_burns_a_core_uses_one_and_a_sleeper_none(docker_client, machine_id):
    rt = DockerRuntime(pull="never")
    burner = asyncio.run(rt.start(machine_id, task("ent/burn", ("sh", "-c", "while :; do :; done")), 1))
    # 20 MiB held in a file of /dev/shm (a tmpfs): working set, not page cache the kernel may drop
    sleeper = asyncio.run(rt.start(machine_id, task("ent/sleep", (
        "sh", "-c", "dd if=/dev/zero of=/dev/shm/x bs=1M count=20 2>/dev/null; sleep 300"), cpus=0.5), 1))
    listed = {c.id: c for c in asyncio.run(rt.list(machine_id))}
    assert listed[burner.id].pid > 0 and listed[sleeper.id].pid > 0
    running = [Running(c.id, c.pid, c.task.job, c.task.index) for c in listed.values()]
    sampler = Sampler()
    ticks = os.sysconf("SC_CLK_TCK")

    def burner_seconds() -> float:  # the burning shell's own CPU time, as the kernel counts it per process
        fields = Path(f"/proc/{listed[burner.id].pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime

    before, t0 = burner_seconds(), time.monotonic()
    assert sampler.sample(running, now=t0) is None, "no window to measure over yet"
    time.sleep(3)
    t1 = time.monotonic()
    usage = sampler.sample(running, now=t1)
    by_process = (burner_seconds() - before) / (t1 - t0)
    by_job = {t[0]: t for t in usage["tasks"]}
    assert set(by_job) == {"ent/burn", "ent/sleep"}
    _, _, burn_cpu, burn_mem = by_job["ent/burn"]
    _, _, sleep_cpu, sleep_mem = by_job["ent/sleep"]
    # its cgroup's figure is the process's own (the two counters differ by a tick or two), at most
    # the core it may use; about one core on an idle machine, less when others load both cores
    assert abs(burn_cpu - by_process) <= 0.1 * by_process + 0.03, (burn_cpu, by_process)
    assert 0.2 <= burn_cpu <= 1.08, burn_cpu
    assert sleep_cpu < 0.05, sleep_cpu
    assert 18 <= sleep_mem <= 64, sleep_mem  # the 20 MiB it holds, within its 64 MiB limit
    assert burn_mem < 16, burn_mem
    assert 2.9 <= usage["window"] <= 4
    assert usage["cpus"] >= 1 and burn_cpu * 0.9 <= usage["cpu"] <= usage["cpus"] + 0.01, usage  # the host: the burner at least
    assert 0 < usage["memory_mb"] < usage["memory_total_mb"]
    assert usage["power_w"] is None if not rapl_zones() else usage["power_w"] > 0
    # a container gone between the list and the read is left out; once no longer listed, forgotten
    asyncio.run(rt.remove(burner.id))
    again = sampler.sample(running, now=t1 + 1)
    assert [t[0] for t in again["tasks"]] == ["ent/sleep"]
    listed = {c.id: c for c in asyncio.run(rt.list(machine_id))}
    sampler.sample([Running(c.id, c.pid, c.task.job, c.task.index) for c in listed.values()], now=t1 + 2)
    assert [k[0] for k in sampler._counters] == [sleeper.id]


def test_a_sample_asked_for_again_at_once_is_the_last_one():
    sampler = Sampler()
    sampler.sample([], now=100.0)
    first = sampler.sample([], now=101.0)
    assert first is not None and first["window"] == 1.0
    assert sampler.sample([], now=101.2) is first  # shorter than MIN_WINDOW: no new window


def test_power_is_read_from_rapl_package_zones_and_wraps(tmp_path):
    """RAPL is not on this machine (no /sys/class/powercap): its files' layout, as the kernel's
    powercap driver writes it, stands in; the host without it reports None (above)."""
    for zone, energy in (("intel-rapl:0", 999_000_000), ("intel-rapl:0:0", 5), ("intel-rapl:1", 10_000_000)):
        (tmp_path / zone).mkdir()
        (tmp_path / zone / "energy_uj").write_text(f"{energy}\n")
        (tmp_path / zone / "max_energy_range_uj").write_text("1000000000\n")
    sampler = Sampler(powercap=tmp_path)
    assert [z.name for z, _ in sampler.host.zones] == ["intel-rapl:0", "intel-rapl:1"]  # not the sub-zone
    sampler.sample([], now=10.0)
    # package 0 wrapped past its range: 999 J -> 1 J is 2 J; package 1: 10 J -> 40 J is 30 J
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1000000\n")
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("40000000\n")
    usage = sampler.sample([], now=12.0)
    assert usage["power_w"] == 16.0  # 32 J over 2 s


def test_a_host_whose_files_cannot_be_read_sends_no_usage_and_the_heartbeat_goes_on(tmp_path, caplog):
    sampler = Sampler(proc=tmp_path)  # no stat, no meminfo there
    assert sampler.sample([], now=1.0) is None and sampler.sample([], now=2.0) is None
    assert sampler.failed and caplog.text.count("usage not measured") == 1
