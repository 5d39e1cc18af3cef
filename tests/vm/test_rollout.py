"""Host-profile rollouts on real guest kernels (issue #28): an entitlement holding both machine VMs
and a job with a task on each (max_unavailable 1: the built-in policy; a TaskController of the job's
would sit on the host, which the control VM cannot call). A profile change reaches the VMs one at
a time, each task stopped before its VM switches and started after; each guest's kernel holds the
new value afterwards. A profile that breaks the tasks (they exit when vm.swappiness is 23) fails
its first batch when the task does not run within the deadline: that VM is rolled back, and the
other is never switched (its kernel never held the value)."""

from __future__ import annotations

import json

import pytest

from tests.vm.test_profiles import back_in_the_free_pool

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2700)]

PROFILE = '[sysctl]\n"vm.swappiness" = {}\n'
# exits (and exits again at each restart) while the kernel holds swappiness 23
TASK = ["sh", "-c", "trap 'exit 0' TERM; while true; do [ \"$(cat /proc/sys/vm/swappiness)\" = 23 ] && exit 1; "
        "sleep 1; done"]


def swappiness(region) -> dict[str, str]:
    return {vm: region.ssh(vm, "cat /proc/sys/vm/swappiness").strip() for vm in ("m1", "m2")}


def test_a_profile_rolls_out_one_vm_at_a_time_and_a_bad_one_is_rolled_back_on_the_first(region, tmp_path):
    for name, value in (("vm-roll-a", 21), ("vm-roll-b", 22), ("vm-roll-bad", 23)):
        region.ssh("control", f"cat > /etc/twine/profiles/{name}.toml <<'EOF'\n{PROFILE.format(value)}EOF")
    ent = region.name("roll")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "2", "--profile", "vm-roll-a",
               "--rollout-deadline", "300")
    spec = tmp_path / "svc.yaml"
    spec.write_text(json.dumps({"entitlement": ent, "name": "svc", "count": 2, "update": {"max_unavailable": 1},
                                "task": {"image": "twine/busybox:1", "command": TASK, "cpus": 0.1, "memory_mb": 16}}))
    try:
        region.ctl("job", "run", str(spec), "--wait", "900")
        assert swappiness(region) == {"m1": "21", "m2": "21"}
        started = {vm: region.containers(vm) for vm in ("m1", "m2")}

        done = region.ctl("entitlement", "modify", ent, "--profile", "vm-roll-b", "--wait", "1200", check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        r = region.ctl("entitlement", "rollout", "status", ent)
        assert r["state"] == "done" and [len(b["machines"]) for b in r["batches"]] == [1, 1], r
        assert swappiness(region) == {"m1": "22", "m2": "22"}, "each guest's kernel holds the new value"
        for vm in ("m1", "m2"):  # its task was stopped around the switch: a new container
            now = region.containers(vm)
            assert now and set(now.values()).isdisjoint(started[vm].values()), (started[vm], now)
        region.wait(lambda: region.ctl("job", "status", f"{ent}/svc")["summary"].get("running") == 2, 600,
                    "both tasks running")

        region.ctl("entitlement", "modify", ent, "--rollout-deadline", "60")
        bad = region.ctl("entitlement", "modify", ent, "--profile", "vm-roll-bad", "--wait", "1200", check=False)
        assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
        r = region.ctl("entitlement", "rollout", "status", ent)
        first = r["batches"][0]
        assert r["state"] == "rolled_back" and first["outcome"] == "failed", r
        assert "tasks not running 60 s after the switch" in first["why"], first
        assert [b["machines"] for b in r["batches"]] == [first["machines"], first["machines"]]
        assert swappiness(region) == {"m1": "22", "m2": "22"}
        by_id = {m["id"]: host for host, m in region.machines().items()}
        other = next(m["id"] for m in r["machines"] if m["id"] != first["machines"][0])
        assert by_id[other] in ("m1", "m2") and all(other not in b["machines"] for b in r["batches"])
        assert region.ctl("entitlement", "show", ent)["profile"] == "vm-roll-b"
        region.wait(lambda: region.ctl("job", "status", f"{ent}/svc")["summary"].get("running") == 2, 600,
                    "both tasks running again")
    finally:
        region.ctl("job", "stop", f"{ent}/svc", "--wait", "600", check=False)
    for vm in ("m1", "m2"):
        back_in_the_free_pool(region, vm)
