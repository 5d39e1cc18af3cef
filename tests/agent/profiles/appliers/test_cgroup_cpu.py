"""The cgroup v2 controller switch on the real kernel.

This host's cpu controller is bound to a cgroup v1 hierarchy, so `[cgroup_cpu]` is not applicable
here, and switching v2 cpu itself is covered inside VMs later. The mechanism (top-down enable,
bottom-up disable, the root left alone) is the same for every v2 controller: it is exercised for
real on this host's cgroup2 hierarchy with the `hugetlb` controller: found in the mount table
(/sys/fs/cgroup/unified on a hybrid host like this one, /sys/fs/cgroup itself on a plain v2 host).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agent.errors import ProfileError
from agent.profiles.appliers.base import HostContext
from agent.profiles.appliers.cgroup_cpu import CgroupCpu
from agent.profiles.model import Holds
from tests.conftest import missing_part



def cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, *_ = line.split()
        if kind == "cgroup2":
            return Path(where)
    return None


UNIFIED = cgroup2_mount() or Path("/sys/fs/cgroup/unified")


def subtree(group: Path) -> list[str]:
    return (group / "cgroup.subtree_control").read_text().split()


def test_this_host_says_whether_the_switch_applies_and_why_not():
    applier = CgroupCpu(HostContext())
    verdict = applier.applicable("enabled")
    root = HostContext().cgroup_root
    if (root / "cgroup.controllers").exists():  # cgroup v2 at the root: applicable where cpu is offered
        offered = "cpu" in (root / "cgroup.controllers").read_text().split()
        assert (verdict is None) == offered, verdict
        if not offered:
            assert "without the cpu controller" in verdict.why
        return
    assert verdict is not None
    assert "cgroup v1 host" in verdict.why and "/sys/fs/cgroup/cpu" in verdict.why
    assert "cannot be switched per subtree" in verdict.why
    assert applier.read("enabled") is True  # v1: always on where the hierarchy is mounted


@pytest.mark.parametrize("section", [{"enabled": "yes"}, {"enabled": 1}, {"on": True}])
def test_parse_wants_one_boolean(section):
    with pytest.raises(ProfileError):
        CgroupCpu(HostContext()).parse(section, "test.toml")


@pytest.fixture
def hugetlb_tree():
    """A unique two-level task group in the cgroup2 hierarchy; removed bottom-up afterwards and the
    root's subtree_control put back."""
    if cgroup2_mount() is None or "hugetlb" not in (UNIFIED / "cgroup.controllers").read_text().split():
        missing_part(f"a cgroup2 hierarchy with the hugetlb controller (looked at {UNIFIED})")
    top = f"twine-test-{uuid.uuid4().hex[:8]}"
    root_had = "hugetlb" in subtree(UNIFIED)
    try:
        yield top
    finally:
        for group in (UNIFIED / top / "tasks", UNIFIED / top):
            if group.exists():
                if "hugetlb" in subtree(group):
                    (group / "cgroup.subtree_control").write_text("-hugetlb")
                group.rmdir()
        if not root_had and "hugetlb" in subtree(UNIFIED):
            (UNIFIED / "cgroup.subtree_control").write_text("-hugetlb")


def test_v2_enable_top_down_and_disable_bottom_up(hugetlb_tree):
    ctx = HostContext(cgroup_root=UNIFIED, task_cgroup=f"{hugetlb_tree}/tasks")
    applier = CgroupCpu(ctx, controller="hugetlb")
    top, tasks = UNIFIED / hugetlb_tree, UNIFIED / hugetlb_tree / "tasks"
    assert applier.applicable("enabled") is None
    assert applier.read("enabled") is False  # the group does not exist yet

    applier.write("enabled", True)
    assert "hugetlb" in subtree(UNIFIED)
    assert "hugetlb" in subtree(top)
    assert "hugetlb" in subtree(tasks)
    assert "hugetlb" in (tasks / "cgroup.controllers").read_text().split()
    assert applier.read("enabled") is True and applier.verify("enabled", True) == Holds()

    applier.write("enabled", False)
    assert "hugetlb" not in subtree(tasks)
    assert "hugetlb" not in subtree(top)
    assert "hugetlb" in subtree(UNIFIED)  # shared with other services' groups: left alone
    assert applier.read("enabled") is False and applier.verify("enabled", False) == Holds()


def test_v2_host_without_the_controller_is_not_applicable():
    applier = CgroupCpu(HostContext(cgroup_root=UNIFIED), controller="no-such-controller")
    verdict = applier.applicable("enabled")
    assert verdict is not None and "without the no-such-controller controller" in verdict.why
