"""Machines that go away for real: a VM powered off hard, and a VM rebooted cleanly."""

from __future__ import annotations

import json
import time

import pytest

from tests.vm.test_profiles import TUNED, kernel

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2700)]  # the first one brings the region up
LOOP = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]


def failures(region, mid: str) -> list[dict]:
    return [e for e in region.ctl("events")["events"] if e["kind"] == "failure" and mid in e["machines"]]


def where(region, handle: str) -> list[tuple[str, str]]:
    by_id = {m["id"]: host for host, m in region.machines().items()}
    return [(by_id.get(t["machine"], t["machine"]), t["state"]) for t in region.ctl("job", "status", handle)["tasks"]]


def swappiness(region, vm: str) -> str:
    return region.ssh(vm, "cat /proc/sys/vm/swappiness").strip()


def test_a_hard_killed_machine_loses_its_tasks_to_another_and_comes_back_clean(region, tmp_path):
    region.put_profile("vm-ha", '[sysctl]\n"vm.swappiness" = 17')
    boot = {vm: swappiness(region, vm) for vm in ("m1", "m2")}
    assert "17" not in boot.values()
    ent = region.name("ha")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "2", "--profile", "vm-ha")
    spec = tmp_path / "ha.yaml"
    spec.write_text(json.dumps({"entitlement": ent, "name": "web", "count": 2, "task": {
        "image": "twine/busybox:1", "command": LOOP, "cpus": 0.1, "memory_mb": 16},
        "preferences": [{"property": "msb", "strategy": "spread"}]}))
    try:
        region.ctl("job", "run", str(spec), "--wait", "600")
        assert sorted(where(region, f"{ent}/web")) == [("m1", "running"), ("m2", "running")]
        assert [swappiness(region, vm) for vm in ("m1", "m2")] == ["17", "17"]
        m1 = region.machines()["m1"]["id"]

        t0 = time.monotonic()
        region.power_cut("m1")  # no shutdown, no notice
        region.wait(lambda: where(region, f"{ent}/web") == [("m2", "running")] * 2, 600,
                    "both tasks running on m2")
        print(f"power cut to both tasks running on m2: {time.monotonic() - t0:.0f} s")
        assert failures(region, m1), "the power cut was not recorded as a failure"
        assert swappiness(region, "m2") == "17"  # the replacements run under the entitlement's profile
        replacements = region.containers("m2")

        region.power_on("m1")
        region.wait(lambda: region.unit("m1", "twine-agent")["ActiveState"] == "active", 600, "m1's agent under systemd")
        region.wait(lambda: region.machines()["m1"]["healthy"], 600, "m1 healthy again")
        # its copy of the moved task is gone (the reboot stopped it; the agent removed it)
        region.wait(lambda: region.ssh("m1", f"docker ps -aq --filter label=twine.job={ent}/web").strip() == "", 300,
                    "no stale container of ha/web on m1")
        # free now: a fresh kernel at its boot value, and no claim of the profile it held before the cut
        machine = region.machines()["m1"]
        assert machine["entitlement"] is None and machine["profile"]["applied"] is None
        assert swappiness(region, "m1") == boot["m1"]
        assert region.ssh("m1", "test -e /var/lib/twine-agent/profile-applied.json && echo stale || echo none").strip() \
            == "none"
        assert region.containers("m2") == replacements, "the replacements were disturbed by m1's return"
    finally:
        region.ctl("job", "stop", f"{ent}/web", "--wait", "600", check=False)


def test_a_clean_reboot_is_no_failure_and_the_task_returns_after_the_profile(region, tmp_path):
    region.put_profile("vm-tuned", TUNED)
    ent = region.name("rb")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "1", "--profile", "vm-tuned",
               "--pin-dc", "dc1")  # m1: the VM with two CPUs to pin IRQs between
    spec = tmp_path / "rb.yaml"
    spec.write_text(json.dumps({"entitlement": ent, "name": "svc", "count": 1, "task": {
        "image": "twine/busybox:1", "command": LOOP, "cpus": 0.25, "memory_mb": 16}}))
    try:
        region.ctl("job", "run", str(spec), "--wait", "600")
        [(vm, state)] = where(region, f"{ent}/svc")
        mid = region.machines()[vm]["id"]
        failed_before = len(failures(region, mid))
        boot_before = region.ssh(vm, "cat /proc/sys/kernel/random/boot_id").strip()

        t0 = time.monotonic()
        region.ssh(vm, "systemctl reboot", check=False)
        region.wait(lambda: where(region, f"{ent}/svc") == [(vm, "suspended")], 300, "the task suspended in place")
        region.wait(lambda: region.ssh(vm, "cat /proc/sys/kernel/random/boot_id", check=False).strip()
                    not in ("", boot_before), 900, f"{vm} booted again", every=5)
        region.wait(lambda: where(region, f"{ent}/svc") == [(vm, "running")], 900, "the task running again on the same VM")
        print(f"clean reboot to the task running again: {time.monotonic() - t0:.0f} s")
        assert len(failures(region, mid)) == failed_before, "a clean reboot was recorded as a failure"
        maint = [e for e in region.ctl("maintenance", "list", "--all")["maintenance"] if e["id"].startswith(f"reboot-{mid}")]
        assert maint and maint[-1]["phase"] == "over"
        after = kernel(region, vm)
        assert (after["swappiness"], after["somaxconn"], after["hugepages"], after["cpu_controller"]) == \
            ("13", "2345", "16", "on"), after
        # applied again in this boot, before the task started
        record = json.loads(region.ssh(vm, "cat /var/lib/twine-agent/profile-applied.json"))
        assert record["boot_id"] != boot_before
        started = json.loads(region.ssh(vm, f"docker inspect $(docker ps -q --filter label=twine.job={ent}/svc)"))[0]
        from agent.reconcile import parse_time

        assert parse_time(started["State"]["StartedAt"]) >= record["applied_at"]
    finally:
        region.ctl("job", "stop", f"{ent}/svc", "--wait", "600", check=False)
