"""Usage measured on real guests (issue #25): Debian with systemd and cgroup v2 alone, where the
agent reads its tasks' cpu.stat and memory.current. A task that burns a core shows about one core
used, a sleeping one about none, in what the control VM's controld answers."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2700)]  # the first one brings the region up

BURN = ["sh", "-c", "trap 'exit 0' TERM; while :; do :; done"]
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


def test_a_task_burning_a_core_on_a_cgroup_v2_guest_shows_about_one_core(region, tmp_path):
    ent = region.name("use")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "2")
    jobs = {"burn": (BURN, 1.0), "idle": (SLEEP, 0.1)}
    try:
        for name, (command, cpus) in jobs.items():
            spec = tmp_path / f"{name}.yaml"  # JSON is YAML
            spec.write_text(json.dumps({"entitlement": ent, "name": name, "count": 1, "task": {
                "image": "twine/busybox:1", "command": command, "cpus": cpus, "memory_mb": 16}}))
            region.ctl("job", "run", str(spec), "--wait", "600")
        seen: dict[str, list] = {"burn": [], "idle": []}

        def measured() -> bool:
            for name in jobs:
                current = region.ctl("job", "usage", f"{ent}/{name}")["current"]
                seen[name].append(None if current is None else current["cpus"])
            burn, idle = seen["burn"][-3:], seen["idle"][-1]
            return len(burn) == 3 and all(b is not None and 0.85 <= b <= 1.15 for b in burn) \
                and idle is not None and idle <= 0.05

        deadline = time.monotonic() + 300
        while not measured() and time.monotonic() < deadline:
            time.sleep(3)
        print(f"\ncores used, as the guests' agents measured them: burn {seen['burn'][-6:]}, idle {seen['idle'][-6:]}")
        assert measured(), seen
        fleet = region.ctl("fleet", "--by", "entitlement")
        cell = next(c for c in fleet["cells"] if c["entitlement"] == ent)
        assert 0.85 <= cell["used"]["cpus"] <= 1.2, cell
    finally:
        for name in jobs:
            region.ctl("job", "stop", f"{ent}/{name}", "--wait", "300", check=False)
