"""What the daemon's allocator is asked in a realistic mix of work, and what it costs (issue #24).

It is why the allocator has no cache: this script, run in a checkout of commit adbaff0 (the daemon
with its job-level cache, whose hits and misses it prints when the daemon has them), gave 2 hits
in 250 allocations over the same 60 s mix; the misses were questions the scheduler had not asked
before (a new job, a resize up, a replacement, a move).

What is measured: a real `twine-controld` on a real etcd (both on this machine), M machines
registered through the API and heartbeating through simulated agents (the agent's wire protocol;
no containers run: tests/controlplane/simagents.py), and for S seconds a mix of what job owners and
machines do, in rounds: creates (jobs of 6 tasks), resizes up and down, updates (a changed task:
rolling restarts, no placement), stops, and machine failures (a simulated agent falls silent for
longer than the heartbeat timeout, its tasks are replaced elsewhere, then it comes back).

Read from the daemon's own /v1/metrics at the end: the placements it committed, and the time its
allocator took per call (twine_allocate_seconds, by what asked: create, or place: a job's tasks
that need a machine), beside the time from a create's request to its answer (the API's path).

    .venv/bin/python bench/bench_allocation_mix.py [--machines 60] [--seconds 60] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.store.etcdproc import EtcdServer  # noqa: E402
from tests.controlplane.controld_proc import Controld  # noqa: E402
from tests.controlplane.frontend.test_controld_api import register  # noqa: E402
from tests.controlplane.simagents import SimAgents  # noqa: E402

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.25, "memory_mb": 64}
TIMEOUT = 2.0  # the daemon's heartbeat timeout: a silent machine is failed after it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="twine-bench-mix-"))
    etcd = EtcdServer().start()
    c = Controld(tmp, etcd.port, heartbeat_timeout=TIMEOUT,
                 extra=("--rate-limits", "job=1000:1000,shard=1000:1000,region=1000:1000"))
    done = {"create": 0, "resize": 0, "update": 0, "stop": 0, "failure": 0}
    create_seconds: list[float] = []  # a create's POST to its 201 (placed and committed)
    try:
        c.start()
        creds = {f"m{i:03d}": register(c, f"m{i:03d}", f"dc{i % 2 + 1}", f"msb{i % 6}", cpus=4, memory_mb=4096)
                 for i in range(args.machines)}
        for e in range(4):
            assert c.call("POST", "/v1/entitlements", {"name": f"e{e}", "machine_type": "generic",
                                                       "quota": args.machines})[0] == 201
        with SimAgents(creds, [c.url], interval=0.3) as agents:
            jobs: dict[str, int] = {}  # handle -> count
            serial = 0
            failed: dict[str, float] = {}  # machine -> when it fell silent
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                now = time.monotonic()
                for mid, since in list(failed.items()):  # back after twice the timeout
                    if now - since > 2 * TIMEOUT + 1:
                        agents.cut.discard(mid)
                        del failed[mid]
                kind = rnd.choices(["create", "resize", "update", "stop", "failure"], [4, 4, 2, 1, 1])[0]
                if kind == "create" or not jobs:
                    serial += 1
                    handle = f"e{serial % 4}/j{serial}"
                    ent, name = handle.split("/")
                    began = time.perf_counter()
                    if c.call("POST", "/v1/jobs", {"entitlement": ent, "name": name, "count": 6, "task": TASK})[0] == 201:
                        create_seconds.append(time.perf_counter() - began)
                        jobs[handle] = 6
                        done["create"] += 1
                elif kind == "resize":
                    handle = rnd.choice(sorted(jobs))
                    count = max(1, jobs[handle] + rnd.choice([-2, -1, 1, 2, 3]))
                    if c.call("POST", f"/v1/jobs/{handle}/resize", {"count": count})[0] == 200:
                        jobs[handle] = count
                        done["resize"] += 1
                elif kind == "update":
                    handle = rnd.choice(sorted(jobs))
                    ent, name = handle.split("/")
                    spec = {"entitlement": ent, "name": name, "count": jobs[handle],
                            "task": {**TASK, "env": {"V": str(serial)}}}
                    if c.call("PUT", f"/v1/jobs/{handle}", spec)[0] == 200:
                        done["update"] += 1
                elif kind == "stop" and len(jobs) > 4:
                    handle = rnd.choice(sorted(jobs))
                    if c.call("DELETE", f"/v1/jobs/{handle}")[0] == 202:
                        del jobs[handle]
                        done["stop"] += 1
                elif kind == "failure" and len(failed) < 2:
                    mid = rnd.choice(sorted(set(creds) - set(failed)))
                    agents.cut.add(mid)
                    failed[mid] = now
                    done["failure"] += 1
                time.sleep(0.2)
            agents.cut.clear()
            time.sleep(2 * TIMEOUT)
        m = c.metrics()
    finally:
        c.close()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.machines} machines, {args.seconds:g} s of work: " + ", ".join(f"{n} {k}s" for k, n in done.items()))
    print(f"  placements committed by the daemon: {m.get('twine_scheduler_placements_total', 0):.0f}")
    if create_seconds:
        print(f"  a create through the API (POST to 201, placed and committed): mean "
              f"{1000 * sum(create_seconds) / len(create_seconds):.2f} ms")
    if "twine_allocation_cache_hits_total" in m:  # a daemon that has the cache (adbaff0 and before)
        hits, misses = m["twine_allocation_cache_hits_total"], m["twine_allocation_cache_misses_total"]
        print(f"  allocation cache: {hits:.0f} hits, {misses:.0f} misses (hit ratio {hits / max(1, hits + misses):.2f})")
    for why in ("create", "place"):
        n = m.get(f'twine_allocate_seconds_count{{why="{why}"}}')
        if n:
            mean = m[f'twine_allocate_seconds_sum{{why="{why}"}}'] / n
            print(f"  allocations for a {why}: {n:.0f}, mean {mean * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
