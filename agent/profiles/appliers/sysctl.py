"""Kernel parameters under /proc/sys, limited to an allow-list of prefixes.

    [sysctl]
    "net.core.somaxconn" = 4096
    "net.ipv4.tcp_rmem" = "4096 87380 6291456"
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from agent.errors import ProfileError
from agent.profiles.appliers.base import KERNEL, NETNS, Applier, ApplierError
from agent.profiles.model import NotApplicable, Setting

_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[A-Za-z0-9_][A-Za-z0-9_\-]*)+$")
# Knobs another applier owns: two owners of one fact would fight.
_OWNED_ELSEWHERE = {
    "vm.nr_hugepages": "hugepages",
    "vm.nr_hugepages_mempolicy": "hugepages",
    "vm.nr_overcommit_hugepages": "hugepages",
}


def _mem_total_kb(proc: Path) -> int:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 20  # unknown: as if 1 GiB, the strict side


def _holds(ok: Callable[[str, Path], bool], value: str, proc: Path) -> bool:
    try:
        return ok(value, proc)
    except ValueError:
        return False


# Within the allow-list, settings that would hurt the host itself, whatever the workload: a profile
# may not set them, or only within bounds (issue #11).
_Guard = tuple[str, Callable[[str, Path], bool], str]  # (the names it holds, as said to a user; ok; why)
_GUARDS: tuple[_Guard, ...] = (
    ("vm.panic_on_oom", lambda v, _: v == "0", "only 0: a host short of memory kills a task, it does not panic"),
    ("kernel.sched_rt_runtime_us, kernel.sched_rt_period_us", lambda v, _: 0 < int(v) <= 1_000_000,
     "from 1 to 1000000: -1 lets real-time tasks take every CPU"),
    ("net.ipv4|6.ip_forward, net.ipv4|6.conf.IFACE.forwarding", lambda v, _: v == "0",
     "only 0: a profile does not make a host a router"),
    ("vm.min_free_kbytes", lambda v, proc: 0 < int(v) <= _mem_total_kb(proc) // 20,
     "at most 5% of the host's memory (more starves its processes)"),
    # limits that, set low, leave the host unable to start a process or open a file
    ("kernel.pid_max", lambda v, _: 32768 <= int(v) <= 4_194_304,
     "from 32768 to 4194304: fewer process ids stop the host forking"),
    ("kernel.threads-max", lambda v, _: int(v) >= 16384,
     "at least 16384: fewer threads stop the host's services starting"),
    ("fs.file-max, fs.nr_open", lambda v, _: int(v) >= 65536,
     "at least 65536: fewer open files starve the host's services"),
    ("vm.overcommit_memory", lambda v, _: v in ("0", "1"),
     "0 or 1: 2 (strict accounting) can leave the host unable to start processes"),
)


def _pattern(names: str) -> re.Pattern:
    """The sysctls a guard's names say: "a, b"; "ipv4|6" either; IFACE any one interface."""
    alternatives = []
    for name in names.split(", "):
        rx = re.escape(name).replace(r"ipv4\|6", "ipv[46]").replace("IFACE", "[^.]+")
        alternatives.append(rx)
    return re.compile("(" + "|".join(alternatives) + ")$")


# the pattern a guard holds is made from the names it says: the list a user is told is the one held
_GUARDED: tuple[tuple[re.Pattern, tuple[Callable[[str, Path], bool], str]], ...] = tuple(
    (_pattern(names), (ok, why)) for names, ok, why in _GUARDS)
GUARDED_NAMES = ", ".join(names for names, _, _ in _GUARDS)


def is_guarded(name: str) -> bool:
    """A sysctl a guard holds (an operator names it in agent.toml sysctl_unguarded to lift it)."""
    return any(pattern.match(name) for pattern, _ in _GUARDED)


def normalise(value: Any) -> str:
    """Kernel form: integers as decimal, vectors separated by single spaces."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return " ".join(normalise(v) for v in value)
    return " ".join(str(value).split())


class Sysctl(Applier):
    name = "sysctl"
    order = 10

    def _path(self, key: str) -> Path:
        return self.ctx.proc / "sys" / key.replace(".", "/")

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        settings = []
        for key, value in section.items():
            field = f"[sysctl] {key}"
            if not isinstance(key, str) or not _NAME.fullmatch(key):
                raise ProfileError(origin, field, value, "not a sysctl name (like net.core.somaxconn)")
            if key in _OWNED_ELSEWHERE:
                raise ProfileError(
                    origin, field, value, f"set it in the [{_OWNED_ELSEWHERE[key]}] section instead"
                )
            if not any(key == p.rstrip(".") or key.startswith(p) for p in self.ctx.sysctl_prefixes):
                raise ProfileError(
                    origin, field, value,
                    "not in the allow-list of sysctl prefixes: " + ", ".join(self.ctx.sysctl_prefixes),
                )
            for pattern, (ok, why) in _GUARDED:
                if pattern.match(key) and key not in self.ctx.sysctl_unguarded \
                        and not _holds(ok, normalise(value), self.ctx.proc):
                    raise ProfileError(origin, field, value, f"{why} (the host's operator may lift this guard: "
                                       f"sysctl_unguarded = [\"{key}\"] in agent.toml)")
            root = (self.ctx.proc / "sys").resolve()
            path = self._path(key).resolve()
            if root not in path.parents:
                raise ProfileError(origin, field, value, "resolves outside /proc/sys")
            if not isinstance(value, (int, str, list, tuple)) or normalise(value) == "":
                raise ProfileError(origin, field, value, "value must be an integer, a string or a list")
            settings.append(Setting(self.name, key, normalise(value), origin))
        return settings

    def check(self, settings: list[Setting]) -> None:
        for s in settings:
            path = self._path(s.key)
            if self.applicable(s.key) is not None or (not self.ctx.owns_kernel and self.scope(s.key) == KERNEL):
                continue  # reported as not applicable, not an error
            if not path.is_file():
                raise ProfileError(s.origin, f"[sysctl] {s.key}", s.value, f"no such sysctl on this host ({path})")
            if not os.access(path, os.W_OK) or not (path.stat().st_mode & 0o222):
                raise ProfileError(s.origin, f"[sysctl] {s.key}", s.value, f"read-only on this host ({path})")

    def scope(self, key: str) -> str:
        """net.* sysctls belong to the network namespace, except the few that are kernel-wide
        (net.core.netdev_max_backlog...): a namespace other than the host's does not show those."""
        if not key.startswith("net."):
            return KERNEL
        return NETNS if self._path(key).exists() or _in_host_netns(self.ctx.proc) else KERNEL

    def applicable(self, key: str) -> NotApplicable | None:
        if self.scope(key) == KERNEL and key.startswith("net.") and not self._path(key).exists():
            return NotApplicable("kernel-wide net sysctl: not visible from this agent's network namespace; "
                                 "set it from the host's")
        return None

    def read(self, key: str) -> str:
        return normalise(self._path(key).read_text())

    def write(self, key: str, value: str) -> None:
        try:
            with open(self._path(key), "w") as f:
                f.write(value)
        except OSError as e:
            raise ApplierError(f"writing {value!r} to {self._path(key)}: {e.strerror}") from e


def _in_host_netns(proc: Path) -> bool:
    """Whether this process is in the host's network namespace: it shares PID 1's, or (when PID 1's
    is not readable, as in some containers) it sees net.core.dev_weight, which the kernel shows in
    the initial network namespace only."""
    try:
        return os.stat(proc / "self/ns/net").st_ino == os.stat(proc / "1/ns/net").st_ino
    except OSError:
        return (proc / "sys/net/core/dev_weight").exists() or not (proc / "self/ns/net").exists()


APPLIER = Sysctl
