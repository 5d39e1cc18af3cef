"""What this host's tasks use, and the host itself (issue #25), read from the kernel at each
heartbeat: not through Docker's stats API, which takes a second or more per container.

- a task: its container's cgroup, found once from /proc/<pid>/cgroup of the container's first
  process. cgroup v2: `cpu.stat` usage_usec, `memory.current` less `inactive_file` of
  `memory.stat`; v1: `cpuacct.usage` (ns), `memory.usage_in_bytes` less `total_inactive_file`.
  Memory is the working set (what kubelet and cAdvisor call it: page cache the kernel can drop
  is not counted);
- the host: psutil's CPU times (the time its CPUs were not idle, from /proc/stat) and memory
  (MemTotal less MemAvailable, from /proc/meminfo); power from RAPL's `energy_uj` under /sys/class/powercap where the host has it,
  else None: unmeasured, never made up.

CPU is in cores used over the window since the last sample (a counter's difference over the
time between the two reads); a task first seen has no window yet and is reported from its
second sample on. `Sampler.sample` costs a few file reads a task (bench/bench_usage.py)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import psutil

log = logging.getLogger("twine.agent.usage")
MIN_WINDOW = 0.5  # seconds: a sample asked for sooner than this after the last returns the last
PROC = Path("/proc")
POWERCAP = Path("/sys/class/powercap")


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _field(text: bytes, name: bytes) -> int:
    """The value of `name` in a flat keyed file (memory.stat, cpu.stat); 0 when absent."""
    key = name + b" "
    if text.startswith(key):
        start = len(key)
    else:
        at = text.find(b"\n" + key)
        if at < 0:
            return 0
        start = at + 1 + len(key)
    end = text.find(b"\n", start)
    return int(text[start:end] if end >= 0 else text[start:])


def mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[dict[str, str], str | None]:
    """Where each cgroup v1 controller is mounted, and the cgroup v2 hierarchy (None: none)."""
    v1: dict[str, str] = {}
    v2 = None
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return v1, v2
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) < 5 or len(kind) < 3:
            continue
        if kind[0] == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif kind[0] == "cgroup":
            for opt in kind[2].split(","):
                if opt in ("cpuacct", "memory"):
                    v1.setdefault(opt, fields[4])
    return v1, v2


@dataclass(frozen=True)
class Counters:
    """Where one container's counters are."""

    cpu: str  # cpuacct.usage (v1, ns) or cpu.stat (v2, usage_usec)
    memory: str  # memory.usage_in_bytes (v1) or memory.current (v2)
    stat: str  # memory.stat
    v2: bool

    def read(self) -> tuple[int, int]:
        """(CPU time in ns, working set in bytes)."""
        stat = _read(self.stat)
        if self.v2:
            cpu = _field(_read(self.cpu), b"usage_usec") * 1000
            inactive = _field(stat, b"inactive_file")
        else:
            cpu = int(_read(self.cpu))
            inactive = _field(stat, b"total_inactive_file")
        return cpu, max(0, int(_read(self.memory)) - inactive)


def counters_of(pid: int, v1: dict[str, str], v2: str | None, proc: Path = PROC) -> Counters | None:
    """The counters of the cgroup that process `pid` is in; None when it is gone or has none."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    paths: dict[str, str] = {}
    unified = None
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            unified = path
        for c in controllers.split(","):
            paths[c] = path
    if "cpuacct" in paths and "memory" in paths and "cpuacct" in v1 and "memory" in v1:
        cpu_dir = v1["cpuacct"] + paths["cpuacct"]
        mem_dir = v1["memory"] + paths["memory"]
        found = Counters(cpu_dir + "/cpuacct.usage", mem_dir + "/memory.usage_in_bytes", mem_dir + "/memory.stat", False)
    elif unified is not None and v2 is not None:
        d = v2 + unified.rstrip("/")
        found = Counters(d + "/cpu.stat", d + "/memory.current", d + "/memory.stat", True)
    else:
        return None
    return found


class Host:
    """The host's CPU, memory and (where RAPL is) power, each a difference since the last read."""

    def __init__(self, powercap: Path = POWERCAP):
        self.ncpu = psutil.cpu_count() or 1
        self.zones = rapl_zones(powercap)
        self._cpu: tuple[float, float] | None = None  # (busy, total) CPU seconds
        self._energy: list[int] | None = None

    def sample(self, window: float) -> tuple[float | None, float | None]:
        """(cores in use, watts) over the window since the last call; None for a first call or no RAPL."""
        t = psutil.cpu_times()
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest time is in user's
        busy = total - t.idle - getattr(t, "iowait", 0.0)
        cores = None
        if self._cpu is not None:  # (no tick gone by: none used)
            cores = max(0.0, busy - self._cpu[0]) / max(1e-9, total - self._cpu[1]) * self.ncpu
        self._cpu = (busy, total)
        watts = None
        if self.zones:
            try:
                now = self.energy()
            except (OSError, ValueError):
                now = None
            if now is not None and self._energy is not None and window > 0:
                joules = 0.0
                for a, b, (_, rng) in zip(self._energy, now, self.zones):
                    if b < a and not rng:  # wrapped, by an unknown range: this window is not measured
                        joules = None
                        break
                    joules += ((b - a) % rng if rng else b - a) / 1e6
                watts = None if joules is None else joules / window
            self._energy = now
        return cores, watts

    def energy(self) -> list[int]:
        return [int(_read(str(z / "energy_uj"))) for z, _ in self.zones]

    @staticmethod
    def memory() -> tuple[float, float]:
        """(used, total) MiB: MemTotal less MemAvailable."""
        m = psutil.virtual_memory()
        return (m.total - m.available) / 2**20, m.total / 2**20


def rapl_zones(powercap: Path = POWERCAP) -> list[tuple[Path, int]]:
    """RAPL's package zones (intel-rapl:N named package-N) and each counter's range (0: unknown)."""
    out = []
    try:
        names = sorted(os.listdir(powercap))
    except OSError:
        return []
    for name in names:
        try:  # a package's own zone: not its sub-zones, nor psys or MMIO zones that count it again
            if not (name.startswith("intel-rapl:") and name.count(":") == 1
                    and _read(str(powercap / name / "name")).startswith(b"package-")):
                continue
        except OSError:
            continue
        try:
            rng = int(_read(str(powercap / name / "max_energy_range_uj")))
        except (OSError, ValueError):
            rng = 0
        out.append((powercap / name, rng))
    return out


@dataclass(frozen=True)
class Running:
    """What the sampler needs of one running container."""

    id: str
    pid: int
    job: str
    index: int


class Sampler:
    def __init__(self, proc: Path = PROC, powercap: Path = POWERCAP, mountinfo: str = "/proc/self/mountinfo"):
        self.proc = proc
        self.v1, self.v2 = mounts(mountinfo)
        self.host = Host(powercap)
        self._counters: dict[tuple[str, int], Counters | None] = {}  # (container, pid) -> where
        self._last: dict[str, int] = {}  # container -> CPU ns at the last sample
        self._at: float | None = None
        self.usage: dict | None = None  # the last sample's, as heartbeats carry it
        self.failed = False  # the host's files could not be read (said once)

    def sample(self, running: Iterable[Running], now: float | None = None) -> dict | None:
        """The heartbeat's `usage` (docs/api.md): None until there is a window to measure over,
        and when the host's own files cannot be read (said once in the log): a heartbeat goes
        out all the same."""
        now = time.monotonic() if now is None else now
        if self._at is not None and now - self._at < MIN_WINDOW:
            return self.usage
        try:
            return self._sample(running, now)
        except (OSError, ValueError, IndexError) as e:
            if not self.failed:
                log.warning("usage not measured: %s: %s", type(e).__name__, e)
            self.failed = True
            self._at, self.usage = None, None
            return None

    def _sample(self, running: Iterable[Running], now: float) -> dict | None:
        window = None if self._at is None else now - self._at
        cores, watts = self.host.sample(window or 0.0)
        used, total = Host.memory()
        tasks, last, seen = [], {}, set()
        for c in running:
            key = (c.id, c.pid)
            seen.add(key)
            if key not in self._counters:
                self._counters[key] = counters_of(c.pid, self.v1, self.v2, self.proc) if c.pid > 0 else None
            where = self._counters[key]
            if where is None:
                continue
            try:
                cpu_ns, memory = where.read()
            except (OSError, ValueError):  # gone between the list and the read
                continue
            last[c.id] = cpu_ns
            before = self._last.get(c.id)
            if window and before is not None:
                tasks.append([c.job, c.index, round(max(0, cpu_ns - before) / 1e9 / window, 3), round(memory / 2**20, 1)])
        self._counters = {k: v for k, v in self._counters.items() if k in seen}  # containers gone are forgotten
        self._last, self._at, self.failed = last, now, False
        if window is None or cores is None:
            self.usage = None
            return None
        self.usage = {"window": round(window, 3), "cpus": self.host.ncpu, "cpu": round(cores, 3),
                      "memory_mb": round(used, 1), "memory_total_mb": round(total, 1),
                      "power_w": None if watts is None else round(watts, 1), "tasks": sorted(tasks)}
        return self.usage
