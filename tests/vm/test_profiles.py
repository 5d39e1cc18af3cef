"""Host profiles switched on real kernels: an entitlement's profile, edited on the control hosts
(their /etc/twine/profiles), reaches a machine VM with the job placed there and changes its
kernel; the machine back in the free pool has every value restored."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2700)]  # the first one brings the region up

TUNED = """
[sysctl]
"vm.swappiness" = 13
"net.core.somaxconn" = 2345
[hugepages]
"2M" = 16
[cgroup_cpu]
enabled = true
[irqbalance]
running = false
[irq_affinity]
nic = { match = 'virtio[0-9]+-(input|output)\\.[0-9]+', cpus = "1" }
"""
BATCH = """
[sysctl]
"vm.swappiness" = 71
[cgroup_cpu]
enabled = false
"""
# What a machine's kernel holds, read over SSH: the settings the profiles touch.
READ = r"""
echo swappiness=$(cat /proc/sys/vm/swappiness)
echo somaxconn=$(cat /proc/sys/net/core/somaxconn)
echo hugepages=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)
echo cpu_controller=$(grep -qw cpu /sys/fs/cgroup/twine.slice/cgroup.subtree_control 2>/dev/null && echo on || echo off)
echo irqbalance=$(systemctl is-active irqbalance)
for n in $(grep -E 'virtio[0-9]+-(input|output)\.[0-9]+' /proc/interrupts | cut -d: -f1); do
  echo irq$n=$(cat /proc/irq/$n/smp_affinity_list)
done
"""


def kernel(region, vm: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in region.ssh(vm, READ).split("\n") if "=" in line)


def restorable(values: dict[str, str]) -> dict[str, str]:
    """What a rollback puts back: everything read, but IRQ affinities only while irqbalance is
    stopped; while it runs they are irqbalance's to move at any time (it moves them every 10 s)."""
    if values["irqbalance"] != "active":
        return values
    return {k: v for k, v in values.items() if not (k.startswith("irq") and k[3:].isdigit())}


def run_job(region, tmp_path, entitlement: str, name: str) -> str:
    """Runs a one-task job; the hostname of the VM it landed on."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(json.dumps({"entitlement": entitlement, "name": name, "count": 1, "task": {
        "image": "twine/busybox:1", "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
        "cpus": 0.25, "memory_mb": 16}}))
    region.ctl("job", "run", str(spec), "--wait", "600")
    job = region.ctl("job", "status", f"{entitlement}/{name}")
    by_id = {m["id"]: host for host, m in region.machines().items()}
    return by_id[job["tasks"][0]["machine"]]


def task_container(region, vm: str, handle: str) -> dict:
    out = region.ssh(vm, f"docker inspect $(docker ps -q --filter label=twine.job={handle})")
    return json.loads(out)[0]


def back_in_the_free_pool(region, vm: str) -> None:
    region.wait(lambda: (m := region.machines()[vm])["entitlement"] is None and m["profile"]["applied"] is None,
                600, f"{vm} back in the free pool with its profile rolled back")


def settled(region) -> dict[str, dict[str, str]]:
    """Every machine back in the free pool with no profile (a job stopped by an earlier test
    returns its machine a little after `job stop --wait`); then what each kernel holds."""
    for vm in ("m1", "m2"):
        back_in_the_free_pool(region, vm)
    return {vm: kernel(region, vm) for vm in ("m1", "m2")}


def test_a_profile_edited_on_the_control_vm_tunes_the_machine_kernel_and_is_undone_after(region, tmp_path):
    region.put_profile("vm-tuned", TUNED)
    ent = region.name("tuned")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "1", "--profile", "vm-tuned",
               "--pin-dc", "dc1")  # m1: the VM with two CPUs to pin IRQs between
    before = settled(region)
    try:
        vm = run_job(region, tmp_path, ent, "db")
        after = kernel(region, vm)
        irqs = {k: v for k, v in after.items() if k.startswith("irq") and k[3:].isdigit()}
        assert irqs and set(irqs.values()) == {"1"}, after
        assert (after["swappiness"], after["somaxconn"], after["hugepages"]) == ("13", "2345", "16"), after
        assert after["cpu_controller"] == "on" and after["irqbalance"] != "active", after
        c = task_container(region, vm, f"{ent}/db")
        assert c["HostConfig"]["NanoCpus"] == 250_000_000
        machine = region.machines()[vm]
        assert machine["profile"] == {"desired": "vm-tuned", "applied": "vm-tuned", "ok": True, "error": "",
                                      "hash": machine["profile"]["hash"]} and len(machine["profile"]["hash"]) == 64
    finally:
        region.ctl("job", "stop", f"{ent}/db", "--wait", "600", check=False)
    back_in_the_free_pool(region, vm)
    assert restorable(kernel(region, vm)) == restorable(before[vm])


def test_a_profile_that_turns_the_cpu_controller_off_starts_tasks_without_a_cpu_limit(region, tmp_path):
    region.put_profile("vm-batch", BATCH)
    ent = region.name("batch")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "1", "--profile", "vm-batch")
    before = settled(region)
    try:
        vm = run_job(region, tmp_path, ent, "crunch")
        after = kernel(region, vm)
        assert after["swappiness"] == "71" and after["cpu_controller"] == "off", after
        c = task_container(region, vm, f"{ent}/crunch")
        assert c["HostConfig"]["NanoCpus"] == 0, "cpus is a placement reservation only while the controller is off"
        scope = f"/sys/fs/cgroup/twine.slice/docker-{c['Id']}.scope"
        assert region.ssh(vm, f"test -e {scope}/cpu.max && echo limited || echo free").strip() == "free"
        assert region.ssh(vm, "systemctl show twine.slice -p DisableControllers --value").split() == ["cpu"]
        # systemd does not turn it on again when it realizes the slice
        region.ssh(vm, "systemctl daemon-reload")
        assert kernel(region, vm)["cpu_controller"] == "off"
        assert region.machines()[vm]["profile"]["ok"] is True
    finally:
        region.ctl("job", "stop", f"{ent}/crunch", "--wait", "600", check=False)
    back_in_the_free_pool(region, vm)
    assert restorable(kernel(region, vm)) == restorable(before[vm])
