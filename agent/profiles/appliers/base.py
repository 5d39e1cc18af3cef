"""The life every setting follows: parse, check, read, write, verify.

One applier per family of knobs, one small module each under `agent/profiles/appliers/`, found by
its section name. The engine owns ordering, journaling and rollback; an applier only knows its knob.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from agent.errors import ProfileError
from agent.profiles.model import Differs, Holds, NotApplicable, Setting, Value, Verdict

KERNEL = "kernel"  # one value for the whole kernel: shared by every agent on the host
NETNS = "netns"  # one value per network namespace: every agent owns its own


@dataclass(frozen=True)
class HostContext:
    """What appliers need to know about the host and the agent. Paths are overridable so that
    a profile can be checked against another root; the defaults are the real kernel."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    # The cgroup under which the agent's task containers live, relative to the cgroup root.
    task_cgroup: str = "twine"
    sysctl_prefixes: tuple[str, ...] = (
        "net.",
        "vm.",
        "kernel.sched_",
        "kernel.numa_balancing",
        "kernel.pid_max",
        "kernel.threads-max",
        "fs.file-max",
        "fs.nr_open",
        "fs.inotify.",
        "fs.aio-max-nr",
    )
    # False when another agent on the same kernel owns kernel-wide settings (several agents in
    # network namespaces of one machine): those settings are then "not applicable: shared kernel".
    owns_kernel: bool = True
    # guarded sysctls (sysctl.py) the host's operator allows profiles to set freely (agent.toml)
    sysctl_unguarded: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=dict)


class Applier(abc.ABC):
    """One family of knobs. Subclasses set `name` (the profile section) and `order`."""

    name: ClassVar[str]
    order: ClassVar[int]  # lower applies first, rolls back last

    def __init__(self, ctx: HostContext):
        self.ctx = ctx

    @abc.abstractmethod
    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        """Validate a profile section and turn it into settings. Raise ProfileError naming the
        field and value. Must not touch the host beyond reading."""

    def check(self, settings: list[Setting]) -> None:
        """Host-dependent validation of the whole set before any write (e.g. hugepages that
        memory cannot hold). Raise ProfileError. Default: nothing to check."""

    def scope(self, key: str) -> str:
        """KERNEL or NETNS: who owns this knob when several agents share one kernel."""
        return KERNEL

    def applicable(self, key: str) -> NotApplicable | None:
        """None when the host has this knob, else why not. Default: always applicable."""
        return None

    @abc.abstractmethod
    def read(self, key: str) -> Value:
        """The knob's current value, in the same normal form parse() produces."""

    @abc.abstractmethod
    def write(self, key: str, value: Value) -> None:
        """Set the knob. Raise OSError (or ApplierError) on failure."""

    def verify(self, key: str, value: Value) -> Verdict:
        """Default: read back and compare."""
        actual = self.read(key)
        if actual == value:
            return Holds()
        return Differs(actual, f"is {actual!r}, wanted {value!r}")


def parse_switch(name: str, section: Mapping[str, Any], origin: str) -> list[Setting]:
    """For appliers whose only key is `enabled = true|false` (cgroup_cpu, turbo)."""
    settings = []
    for key, value in section.items():
        if key != "enabled":
            raise ProfileError(origin, f"[{name}] {key}", value, "unknown key; the only key is `enabled`")
        if not isinstance(value, bool):
            raise ProfileError(origin, f"[{name}] {key}", value, "must be true or false")
        settings.append(Setting(name, key, value, origin))
    return settings


class ApplierError(Exception):
    """A write that the kernel refused or that did not take; the engine rolls the profile back."""
