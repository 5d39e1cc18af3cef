"""Job allocations per second on a 100,000-machine region: the indexed allocator beside a naive
full-scan placement measured in the same run.

Context (Twine, OSDI 2020, sections 2.3 and 3.1): at its peak a large production allocator performs
about 1,000 job allocations per second, with an average job size of 36 tasks, helped by a job-level
cache whose hit ratio is typically above 99%. Ours has no cache: our scheduler never asks the same
question twice (bench_allocation_mix.py). The allocator here is one Python process on one core.

The region: 2 dcs x 10 msbs x 50 racks x 100 machines (100,000), three machine types (one per
rack, in turn), 1 in 50 machines unhealthy. 30 entitlements each already hold 300 machines spread
over the region, half full with tasks of earlier jobs; the rest is the free pool. Jobs have 36
tasks of 1-4 cpus and 2-8 GB, spread over dc and msb by default, some pack or spread over racks.

    (a) indexed: every job allocated on the region's index;
    (c) naive:  for each task, every machine in the region is checked against the hard
                requirements, the survivors are scored and the best is picked (allocate_naive:
                the same rules and tie-breaks, no index). Its placements are checked to equal (a)'s.

Placements are not committed between jobs, so every job sees the same region.

    .venv/bin/python bench/bench_allocator.py [--seconds 5] [--naive-jobs 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.allocator import (  # noqa: E402
    Entitlement, JobRequest, Machine, PlacedTask, Snapshot, SoftPreference, SpreadPolicy,
    allocate, allocate_naive,
)

TYPES = ("skylake", "cooperlake", "milan")
TASKS_PER_JOB = 36


def build_region(rnd: random.Random) -> Snapshot:
    machines = []
    for d in range(2):
        for b in range(10):
            for r in range(50):
                for k in range(100):
                    n = len(machines)
                    machines.append(Machine(f"m{n:06d}", "region1", f"dc{d}", f"msb{b}", f"rack{r:02d}",
                                            TYPES[r % 3], 36.0, 65536, n % 50 != 7))
    ents = [Entitlement(f"ent{e:02d}", TYPES[e % 3], 5000, SpreadPolicy(pinned_dc="dc1" if e % 10 == 9 else None))
            for e in range(30)]
    free = {t: [i for i, m in enumerate(machines) if m.machine_type == t] for t in TYPES}
    for pool in free.values():
        rnd.shuffle(pool)
    tasks = []
    for ent in ents:
        pool = free[ent.machine_type]
        mine = [i for i in pool if ent.spread.pinned_dc in (None, machines[i].dc)][:300]
        taken = set(mine)
        free[ent.machine_type] = [i for i in pool if i not in taken]
        for i in mine:
            m = machines[i] = replace(machines[i], entitlement=ent.name)
            for t in range(9):  # 18 of 36 cpus used by tasks of earlier jobs
                tasks.append(PlacedTask(f"{ent.name}/old{i}", t, m.id, 2.0, 2048))
    return Snapshot.build(machines, ents, tasks)


def job_requests(rnd: random.Random, n: int) -> list[JobRequest]:
    prefs = [None, None, None, (SoftPreference("msb", "pack"),),
             (SoftPreference("msb", "spread"), SoftPreference("rack", "spread", 0.5))]
    return [JobRequest(f"ent{rnd.randrange(30):02d}/job{j}", TASKS_PER_JOB, float(rnd.choice([1, 2, 4])),
                       rnd.choice([2048, 4096, 8192]), preferences=rnd.choice(prefs)) for j in range(n)]


def rate(fn, requests: list[JobRequest], seconds: float) -> tuple[float, int]:
    """Jobs per second, running `fn` over `requests` in turn for about `seconds`."""
    done = 0
    t0 = time.perf_counter()
    while True:
        fn(requests[done % len(requests)])
        done += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done / elapsed, done


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0, help="per measured phase (a) and (b)")
    ap.add_argument("--naive-jobs", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=500, help="distinct job requests")
    args = ap.parse_args()
    rnd = random.Random(2020)

    t0 = time.perf_counter()
    region = build_region(rnd)
    built = time.perf_counter() - t0
    requests = job_requests(rnd, args.jobs)
    print(f"region: {len(region.machines):,} machines, {sum(region.held(e) for e in region.entitlements):,} "
          f"held by {len(region.entitlements)} entitlements; region and snapshot built in {built:.2f} s")

    cold, cold_n = rate(lambda r: allocate(region, r), requests, args.seconds)
    print(f"(a) indexed: {cold:10,.1f} job allocations/s  ({cold_n:,} jobs of {TASKS_PER_JOB} tasks)")

    naive_requests = requests[: args.naive_jobs]
    t0 = time.perf_counter()
    naive_placements = [allocate_naive(region, r) for r in naive_requests]
    naive = len(naive_requests) / (time.perf_counter() - t0)
    same = naive_placements == [allocate(region, r) for r in naive_requests]
    print(f"(c) naive:   {naive:10,.3f} job allocations/s  ({len(naive_requests)} jobs, every machine checked for "
          f"every task; same placements as (a): {same})")
    print(f"ratio vs naive: indexed {cold / naive:,.0f}x")

    placement = allocate(region, requests[0])
    t0 = time.perf_counter()
    region.apply_placement(placement)
    print(f"commit into the snapshot (in place; bench_commit.py measures it): {1000 * (time.perf_counter() - t0):.2f} ms")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
