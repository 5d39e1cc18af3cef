"""The cgroup v2 cpu controller for the agent's task containers.

    [cgroup_cpu]
    enabled = true    # tasks get cpu.weight / cpu.max; false trades that for less scheduler overhead

"Enabled" means `cpu` is in cgroup.subtree_control of the task group (HostContext.task_cgroup),
so every task container below it has the cpu controller. On cgroup v1 the cpu controller is a
hierarchy of its own that every group is always in: not applicable there.

Where systemd is PID 1 and the task group is a slice (twine.slice), that file is not ours alone,
as measured on Debian 12 (systemd 252, Docker's systemd cgroup driver, runc):
- systemd writes it whenever it realizes the slice: it turns every controller on while a
  container scope (Delegate=yes) lives there, off when the last one goes, and undoes a
  hand-written `+cpu` at the next daemon-reload;
- runc writes `+cpu` (every controller the root has) into each ancestor of every container it
  creates, whatever systemd says.
So the switch goes through systemd first: off is `DisableControllers=cpu` on the slice (a runtime
drop-in: systemd never turns it on there again) and `-cpu` written on the slice; the agent writes
`-cpu` again after each container it starts (Engine.hold), since runc has just turned it on. On
is that drop-in cleared (and `+cpu` written while containers run): the controller is then on for
every task container, and an idle slice that systemd trimmed reads as enabled (the parent passes
it on and nothing disables it), so a rollback leaves the file as systemd keeps it.
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path
from typing import Any, Mapping

from agent.profiles.appliers.base import Applier, ApplierError, HostContext, parse_switch
from agent.profiles.model import NotApplicable, Setting
from agent.sdnotify import systemd_is_pid1


class CgroupCpu(Applier):
    name = "cgroup_cpu"
    order = 30
    controller = "cpu"  # the mechanism is the same for every controller; tests use another one

    def __init__(self, ctx: HostContext, controller: str | None = None):
        super().__init__(ctx)
        self.controller = controller or self.controller

    def _chain(self) -> list[Path]:
        """The root, each ancestor of the task group, then the task group itself."""
        chain = [self.ctx.cgroup_root]
        for part in Path(self.ctx.task_cgroup).parts:
            chain.append(chain[-1] / part)
        return chain

    def _v2(self) -> bool:
        return (self.ctx.cgroup_root / "cgroup.controllers").is_file()

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        return parse_switch(self.name, section, origin)

    def applicable(self, key: str) -> NotApplicable | None:
        if not self._v2():
            return NotApplicable(self._v1_reason())
        available = (self.ctx.cgroup_root / "cgroup.controllers").read_text().split()
        if self.controller not in available:
            return NotApplicable(
                f"cgroup v2 host without the {self.controller} controller: "
                f"{self.ctx.cgroup_root}/cgroup.controllers lists {' '.join(available) or 'nothing'}"
            )
        return None

    def _v1_hierarchy(self) -> Path | None:
        path = self.ctx.cgroup_root / self.controller
        return path if (path / "cgroup.procs").is_file() else None

    def _v1_reason(self) -> str:
        path = self._v1_hierarchy()
        if path is None:
            return f"cgroup v1 host without a {self.controller} hierarchy at {self.ctx.cgroup_root / self.controller}"
        from cgroupspy import trees  # v1 hosts only: keeps the import off the common path

        tree = trees.Tree(root_path=str(self.ctx.cgroup_root), groups=[self.controller])
        node = tree.get_node_by_path(f"/{self.controller}/{self.ctx.task_cgroup}")
        group = f"; task group {self.ctx.task_cgroup} does not exist there yet"
        if node is not None and self.controller == "cpu":
            c = node.controller
            quota = "unlimited" if c.cfs_quota_us is None else c.cfs_quota_us  # cgroupspy reads -1 as None
            group = f"; task group {self.ctx.task_cgroup} has cpu.shares={c.shares} cpu.cfs_quota_us={quota}"
        elif node is not None:
            group = f"; task group {self.ctx.task_cgroup} is at {path / self.ctx.task_cgroup}"
        return (
            f"cgroup v1 host: the {self.controller} controller is its own hierarchy at {path} and is always "
            f"on for every group; it cannot be switched per subtree{group}"
        )

    def _enabled(self, group: Path) -> bool:
        try:
            return self.controller in (group / "cgroup.subtree_control").read_text().split()
        except FileNotFoundError:
            return False

    def _slice(self) -> str | None:
        """The systemd slice unit that owns the task group, when systemd is PID 1 and the task group
        is a slice; None when the agent alone writes its cgroup.subtree_control."""
        name = Path(self.ctx.task_cgroup).name
        return name if name.endswith(".slice") and systemd_is_pid1(self.ctx.proc) else None

    def _systemctl(self, *args: str) -> str:
        r = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ApplierError(f"systemctl {' '.join(args)}: {r.stderr.strip() or f'exit {r.returncode}'}")
        return r.stdout

    def _disabled(self, unit: str) -> set[str]:
        return set(self._systemctl("show", unit, "-p", "DisableControllers", "--value").split())

    def read(self, key: str) -> bool:
        if not self._v2():
            return self._v1_hierarchy() is not None  # v1: always on wherever the hierarchy is mounted
        chain = self._chain()
        if self._enabled(chain[-1]):
            return True
        unit = self._slice()
        if unit is None:
            return False
        # systemd trims an idle slice's controllers and turns them on for each container scope:
        # there, enabled means passed on by the parent and not disabled through systemd.
        return self._enabled(chain[-2]) and self.controller not in self._disabled(unit)

    def write(self, key: str, value: bool) -> None:
        if not self._v2():
            raise ApplierError(self._v1_reason())
        chain = self._chain()
        if unit := self._slice():
            disabled = self._disabled(unit) - {self.controller} | ({self.controller} if not value else set())
            # Assignments apply in order: the first resets the list, the second sets it whole.
            self._systemctl("set-property", "--runtime", unit, "DisableControllers=",
                            *([f"DisableControllers={' '.join(sorted(disabled))}"] if disabled else []))
            if value and not any(d.is_dir() for d in chain[-1].glob("*")):
                return  # idle: systemd turns it on for the next container scope, as it owns the file
        if value:
            # A controller can be enabled in a group only once its parent has it: top-down.
            for group in chain:
                group.mkdir(exist_ok=True)
                if not self._enabled(group):
                    self._control(group, "+")
        else:
            # Children first, or the parent refuses. Only the groups named by task_cgroup (which
            # the agent creates and owns) are switched; the root stays as it is, because other
            # services' groups below it use the controller too.
            for group in reversed(chain[1:]):
                if self._enabled(group):
                    self._control(group, "-")

    def _control(self, group: Path, sign: str) -> None:
        path = group / "cgroup.subtree_control"
        try:
            path.write_text(f"{sign}{self.controller}")
        except OSError as e:
            hint = ""
            if e.errno == errno.EBUSY:
                hint = " (cgroup v2's no-internal-process rule: a group with processes of its own cannot pass it on)"
            raise ApplierError(f"writing '{sign}{self.controller}' to {path}: {e.strerror}{hint}") from e


APPLIER = CgroupCpu
