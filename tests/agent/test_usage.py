"""What the agent measures of its tasks and its host (issue #25): real containers under the real
Docker daemon, read from their cgroups as the kernel keeps them (v1 here); the files of cgroup v2
and of RAPL, which this machine does not have, as the kernel lays them out."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
import pytest

from agent.models import TaskSpec
from agent.runtime.docker_runtime import DockerRuntime
from agent.usage import Running, Sampler, counters_of, rapl_zones
from tests.conftest import TEST_IMAGE


def task(job: str, command: tuple[str, ...], cpus: float = 1.0, memory_mb: int = 64) -> TaskSpec:
    return TaskSpec(job=job, index=0, spec_version=1, image=TEST_IMAGE, command=command, cpus=cpus,
                    memory_mb=memory_mb, network_mode="none")


@pytest.mark.docker
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
    # it burns (0.165 of a core once in CI, while three VMs booted on the two cores), at most the core
    assert 0.05 <= burn_cpu <= 1.08, burn_cpu
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


def rapl(root: Path, zones: dict[str, tuple[str, int, int]]) -> None:
    """A powercap tree as the kernel's driver lays it out: zone -> (name, energy_uj, range)."""
    for zone, (name, energy, rng) in zones.items():
        (root / zone).mkdir(exist_ok=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text(f"{energy}\n")
        if rng:
            (root / zone / "max_energy_range_uj").write_text(f"{rng}\n")


def test_power_is_read_from_rapl_package_zones_and_wraps(tmp_path):
    """RAPL is not on this machine (no /sys/class/powercap): its files' layout, as the kernel's
    powercap driver writes it, stands in; the host without it reports None (above)."""
    rapl(tmp_path, {"intel-rapl:0": ("package-0", 999_000_000, 10**9), "intel-rapl:0:0": ("core", 5, 10**9),
                    "intel-rapl:1": ("package-1", 10_000_000, 10**9), "intel-rapl:2": ("psys", 7, 10**9),
                    "intel-rapl-mmio:0": ("package-0", 999_000_000, 10**9)})
    sampler = Sampler(powercap=tmp_path)
    # the packages' zones; not a sub-zone, the platform's (psys) or the MMIO copy of package 0
    assert [z.name for z, _ in sampler.host.zones] == ["intel-rapl:0", "intel-rapl:1"]
    sampler.sample([], now=10.0)
    # package 0 wrapped past its range: 999 J -> 1 J is 2 J; package 1: 10 J -> 40 J is 30 J
    rapl(tmp_path, {"intel-rapl:0": ("package-0", 1_000_000, 10**9), "intel-rapl:1": ("package-1", 40_000_000, 10**9)})
    usage = sampler.sample([], now=12.0)
    assert usage["power_w"] == 16.0  # 32 J over 2 s


def test_a_wrap_of_a_counter_whose_range_is_unknown_is_not_measured(tmp_path):
    rapl(tmp_path, {"intel-rapl:0": ("package-0", 900, 0)})
    sampler = Sampler(powercap=tmp_path)
    sampler.sample([], now=10.0)
    rapl(tmp_path, {"intel-rapl:0": ("package-0", 100, 0)})
    assert sampler.sample([], now=11.0)["power_w"] is None
    rapl(tmp_path, {"intel-rapl:0": ("package-0", 2_000_100, 0)})
    assert sampler.sample([], now=12.0)["power_w"] == 2.0  # 2 J in 1 s


@pytest.mark.parametrize("version", [1, 2])
def test_a_tasks_memory_is_its_working_set_without_the_cache_the_kernel_may_drop(tmp_path, version):
    """The cgroup files as each version of the kernel's cgroups lays them out (for v2 this machine
    has no controllers; the VM tests run it for real): 100 MiB charged, 40 MiB of it inactive file
    cache, is 60 MiB used; CPU time in ns (v1) or us (v2)."""
    mib = 2**20
    (tmp_path / "proc" / "42").mkdir(parents=True)
    if version == 1:
        cpu_dir, mem_dir = tmp_path / "cpuacct" / "docker" / "c1", tmp_path / "memory" / "docker" / "c1"
        cpu_dir.mkdir(parents=True)
        mem_dir.mkdir(parents=True)
        (tmp_path / "proc" / "42" / "cgroup").write_text("5:memory:/docker/c1\n3:cpu,cpuacct:/docker/c1\n0::/\n")
        (cpu_dir / "cpuacct.usage").write_text("1500000000\n")
        (mem_dir / "memory.usage_in_bytes").write_text(f"{100 * mib}\n")
        (mem_dir / "memory.stat").write_text(f"cache 5\ninactive_file {99 * mib}\ntotal_inactive_file {40 * mib}\n")
        v1, v2 = {"cpuacct": str(tmp_path / "cpuacct"), "memory": str(tmp_path / "memory")}, str(tmp_path / "unified")
    else:
        d = tmp_path / "cg" / "system.slice" / "docker-c1.scope"
        d.mkdir(parents=True)
        (tmp_path / "proc" / "42" / "cgroup").write_text("0::/system.slice/docker-c1.scope\n")
        (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
        (d / "memory.current").write_text(f"{100 * mib}\n")
        (d / "memory.stat").write_text(f"anon {60 * mib}\nactive_file 0\ninactive_file {40 * mib}\n")
        v1, v2 = {}, str(tmp_path / "cg")
    found = counters_of(42, v1, v2, tmp_path / "proc")
    assert found is not None and found.v2 == (version == 2)
    assert found.read() == (1_500_000_000, 60 * mib)


def test_a_host_whose_files_cannot_be_read_sends_no_usage(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))  # psutil's /proc: empty
    sampler = Sampler()
    assert sampler.sample([], now=1.0) is None and sampler.sample([], now=2.0) is None
    assert sampler.failed and caplog.text.count("usage not measured") == 1
