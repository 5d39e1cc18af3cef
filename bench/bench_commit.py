"""Sustained allocate-and-commit per scheduler shard process without etcd (an upper bound), at
10,000, 100,000 and 1,000,000 machines, and what one commit costs at each size.

What is measured, per size, in one Python process on one core (no etcd anywhere):

    baseline  allocation alone: allocate(snapshot, request) for each job, nothing committed, no
              cache (every job sees the region as built).
    (1)       allocate + commit into the snapshot: for each job, allocate(), then the placement as
              the changes RegionState derives from the commit's records (the free machines taken
              rewritten, now the entitlement's, their version bumped; a task per index holding
              resources: a machine's other records are not rewritten), applied with Snapshot.apply, the call
              RegionState.snapshot() makes. The next job sees this one. "commit" is building those
              changes and the apply.
    (2)       allocate + the daemon's whole commit path, etcd left out: allocate() on RegionState's
              snapshot (as Scheduler.create), then
              Scheduler.commit_placement builds the transaction (task, discovery and job records,
              the machines taken from the free pool and their entitlements' records; every
              machine's record guarded), an in-memory store checks its guards, encodes every value as
              etcd.py does and hands each change to RegionState as its watch would (which decodes
              it), and
              state.snapshot() applies them to the allocator's snapshot. "commit" is everything
              after allocate() returns; "apply" its last part, state.snapshot(). A real commit adds
              etcd's round trip, raft and fsync, which the scheduler awaits under its shard lock:
              so (1) and (2) are upper bounds for a shard, not what it sustains against etcd.
              The scheduler runs with --max-txn-ops 65536 (as our installers configure etcd):
              one transaction a job; at etcd's default 128 a 36-task job takes two.

Jobs have 36 tasks of 0.5-4 cpus and 1-8 GB, in 30 entitlements (10 per machine type, 3 pinned to
a dc, quotas that do not bind); about 20% prefer racks (spread over msbs and racks, or pack racks),
10% pack msbs, 10% require a dc, the rest use their entitlement's spread (dc, msb). Every job is
new, so the region fills as it runs; (1) runs on a copy of the snapshot (frozen out of the garbage
collector's full passes, as RegionState freezes the snapshot it builds at start), (2) on RegionState.

The region: 3 dcs; msbs of 2,000 machines in racks of 40 (but at least 30 msbs, so that at 10,000
machines too a job spreads over about as many msbs and machines as at the larger sizes: 30 msbs
of 333 machines, 50 at 100,000, 500 at 1,000,000); each rack holds one of 3 machine types (36
cpus/64 GB, 48/128 GB, 96/384 GB; 50/30/20%); 1 in 50 machines unhealthy. 40% of the machines are
held by entitlements, each filled 0-90% by a task of an earlier job; the rest are the free pool.
Records and snapshot are built as RegionState builds them at start (the records fed by hand, not
read from etcd); the build times are printed (about a minute at 1,000,000: leave that size out
with --sizes 10000,100000).

The garbage collector is tuned as twine-controld tunes it at start (stalls.tune_collector: a full
pass every 100 collections of generation 1, not 10); --default-gc leaves CPython's default.

Rates are per second of wall time and per second of this process's cpu time (the machine may be
shared); commit costs are wall time. Printed beside each figure: the baseline (allocation alone)
run in the same process, and for the flatness of the commit, its cost at the first size, per commit
and per machine placed on (the commit's cost follows the machines it places tasks on, and a job spreads over a
few more of them in a larger region); also garbage-collector pauses.

    .venv/bin/python bench/bench_commit.py [--sizes 10000,100000,1000000] [--jobs 1000] [--seed 1]
        [--default-gc]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import random
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.allocator import AllocationError, Snapshot, allocate  # noqa: E402
from controlplane.store.records import EntitlementRec, JobRec, MachineRec, Preference, Spread, TaskRec  # noqa: E402
from controlplane.scheduler.placement import job_request  # noqa: E402
from controlplane.scheduler.service import Scheduler  # noqa: E402
from controlplane.daemon.stalls import FULL_EVERY, tune_collector  # noqa: E402
from controlplane.store.state import RegionState  # noqa: E402
from controlplane.store.cells import NOTHING, micro  # noqa: E402
from controlplane.store import Conflict, Revision, Versioned  # noqa: E402
from controlplane.store.codec import encode  # noqa: E402
from controlplane.store.etcd import Change  # noqa: E402
from controlplane.store.keys import Keys  # noqa: E402

TYPES = {"skylake": (36, 65536), "cooperlake": (48, 131072), "milan": (96, 393216)}
TYPE_WEIGHTS = (0.5, 0.3, 0.2)
PER_RACK, PER_MSB, MIN_MSBS, DCS = 40, 2000, 30, 3
TASKS_PER_JOB = 36
KEYS = Keys("bench")


class MemoryStore:
    """etcd's part of a commit, in memory: guards checked against mod revisions, values encoded as
    etcd.py does, each change handed to RegionState as its watch would (the bytes, which
    RegionState decodes)."""

    def __init__(self, state: RegionState) -> None:
        self.state = state
        self.revs = dict(state.revs)
        self.revision = state.index.revision

    async def commit(self, reads: list[Versioned], puts: dict, deletes=()) -> int:
        for r in reads:
            if self.revs.get(r.key, 0) != r.mod_revision:
                raise Conflict(r.key)
        self.revision += 1
        rev, index, events = self.revision, self.state.index, 0
        changes = [(k, encode(v)) for k, v in puts.items()]  # the bytes etcd's watch hands RegionState
        changes += [(k, None) for k in deletes if self.revs.pop(k, None) is not None]
        for key, value in changes:
            events += 1
            if value is not None:
                self.revs[key] = rev
            index._apply(Change(key, value, rev))  # noqa: SLF001 - as the watch does (and on to RegionState)
        return Revision(rev, events)


def build_state(n: int, rnd: random.Random) -> tuple[RegionState, dict]:
    """RegionState fed with the region's records, as its range read at start would."""
    state = RegionState(None, KEYS)
    types = list(TYPES)
    ents = [EntitlementRec(f"ent{e:02d}", types[e % 3], n, spread=Spread(("dc", "msb"), "dc1" if e % 10 == 9 else None))
            for e in range(30)]
    by_type = {t: [e.name for e in ents if e.machine_type == t] for t in types}
    rev = 0
    racks = -(-n // PER_RACK)
    msbs = max(MIN_MSBS, round(n / PER_MSB))
    rack_type = ""
    for i in range(n):
        rack = i // PER_RACK
        msb = rack * msbs // racks  # consecutive racks share an msb
        if i % PER_RACK == 0:
            rack_type = rnd.choices(types, TYPE_WEIGHTS)[0]
        cpus, mem = TYPES[rack_type]
        mid = f"m{i:07d}"
        labels = {"region": "bench", "dc": f"dc{msb % DCS}", "msb": f"msb{msb // DCS:03d}",
                  "rack": f"rack{rack:05d}", "machine_type": rack_type}
        owner = rnd.choice(by_type[rack_type]) if rnd.random() < 0.4 else None
        if owner == "ent09" or owner == "ent19" or owner == "ent29":  # pinned to dc1
            owner = owner if labels["dc"] == "dc1" else None
        fill = rnd.uniform(0, 0.9) if owner else 0.0
        t_cpus, t_mem = round(fill * cpus, 1), int(fill * mem)
        has_task = t_cpus > 0 and t_mem > 0
        rev += 1
        state.machines[mid] = m = MachineRec(mid, mid, labels, {"cpus": cpus, "memory_mb": mem}, owner,
                                             healthy=i % 50 != 7)
        if has_task:  # what its task holds, as RegionState sums it from the tasks it reads
            state.held[mid] = (micro(t_cpus), t_mem)
        state.cells.change(None, m, state.held.get(mid, NOTHING))  # the fleet's sums, as RegionState keeps them
        state.revs[KEYS.machine(mid)] = rev
        if has_task:
            handle, index = f"{owner}/earlier{i // 1000}", i % 1000
            spec = {"image": "bench", "cpus": t_cpus, "memory_mb": t_mem}
            state.tasks[handle][index] = TaskRec(handle, index, 1, spec, mid, "running")
            state.by_machine[mid].add((handle, index))
            rev += 1
            state.revs[KEYS.task(handle, index)] = rev
    for e in ents:
        rev += 1
        state.entitlements[e.name] = e
        state.revs[KEYS.entitlement(e.name)] = rev
    state.index.revision = rev
    return state, {"msbs": msbs, "racks": racks}


def make_jobs(rnd: random.Random, count: int, tag: str) -> list[JobRec]:
    rack_spread = (Preference("msb", "spread"), Preference("rack", "spread", 0.5))
    jobs = []
    for j in range(count):
        e = rnd.randrange(30)
        roll = rnd.random()
        prefs = (rack_spread if roll < 0.12 else (Preference("rack", "pack"),) if roll < 0.2
                 else (Preference("msb", "pack"),) if roll < 0.3 else None)
        dc = f"dc{rnd.randrange(DCS)}" if 0.3 <= roll < 0.4 and e % 10 != 9 else None
        task = {"image": "bench", "cpus": rnd.choice([0.5, 1.0, 2.0, 4.0]),
                "memory_mb": rnd.choice([1024, 2048, 4096, 8192])}
        jobs.append(JobRec(f"ent{e:02d}", f"{tag}{j}", TASKS_PER_JOB, task, dc=dc, preferences=prefs))
    return jobs


@dataclass
class Run:
    jobs_per_s: float
    jobs_per_cpu_s: float  # jobs per second of this process's cpu time: what the shared machine took away left out
    failed: int
    commit_ms: list[float]
    apply_ms: list[float]
    machines_written: int
    gc_ms: list[tuple[int, float]]  # (generation, pause) of each collection during the run

    def line(self, base: float) -> str:
        return (f"{self.jobs_per_s:8,.0f} jobs/s ({self.jobs_per_s / base:.2f} of the baseline; "
                f"{self.jobs_per_cpu_s:,.0f} per cpu second"
                + (f"; {self.failed} did not fit" if self.failed else "") + ")")

    def costs(self) -> str:
        n = len(self.commit_ms)
        return (f"commit p50 {pct(self.commit_ms, 0.5):.3f} ms, p99 {pct(self.commit_ms, 0.99):.3f} ms, "
                f"max {max(self.commit_ms):.1f} ms; {self.machines_written / n:.1f} machines placed on a commit")

    def gc(self) -> str:
        full = [p for g, p in self.gc_ms if g == 2]
        return (f"gc: {len(self.gc_ms)} collections, {sum(p for _, p in self.gc_ms):.0f} ms in all, longest "
                f"{max((p for _, p in self.gc_ms), default=0):.1f} ms; {len(full)} full")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


class GcPauses:
    """Collections and their pauses while in the block."""

    def __enter__(self) -> list[tuple[int, float]]:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0
        gc.callbacks.append(self._note)
        return self.pauses

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], 1000 * (time.perf_counter() - self._started)))


def allocate_only(snap: Snapshot, jobs: list[JobRec]) -> tuple[float, float, int]:
    failed = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for job in jobs:
        try:
            allocate(snap, job_request(job))
        except AllocationError:
            failed += 1
    return len(jobs) / (time.perf_counter() - t0), len(jobs) / (time.process_time() - c0), failed


def into_snapshot(snap: Snapshot, jobs: list[JobRec]) -> Run:
    """(1): allocate, then apply the placement's changes to the snapshot."""
    commit_ms: list[float] = []
    failed = written = 0
    with GcPauses() as pauses:
        t_start, c_start = time.perf_counter(), time.process_time()
        for job in jobs:
            try:
                placement = allocate(snap, job_request(job))
            except AllocationError:
                failed += 1
                continue
            t0 = time.perf_counter()
            snap.apply_placement(placement)
            commit_ms.append(1000 * (time.perf_counter() - t0))
            written += len(placement.claims)
        elapsed, cpu = time.perf_counter() - t_start, time.process_time() - c_start
    return Run(len(jobs) / elapsed, len(jobs) / cpu, failed, commit_ms, commit_ms, written, pauses)


async def through_the_daemon(state: RegionState, jobs: list[JobRec]) -> Run:
    """(2): allocate, Scheduler.commit_placement into the in-memory store, state.snapshot()."""
    # one transaction a job, as with an etcd run with our raised limits (--max-txn-ops 65536)
    scheduler = Scheduler(state, MemoryStore(state), KEYS, reports=lambda mid: None, max_txn_ops=65536)
    commit_ms: list[float] = []
    apply_ms: list[float] = []
    failed = written = 0
    with GcPauses() as pauses:
        t_start, c_start = time.perf_counter(), time.process_time()
        for job in jobs:
            try:
                placement = allocate(state.snapshot(), job_request(job))
            except AllocationError:
                failed += 1
                continue
            t0 = time.perf_counter()
            await scheduler.commit_placement(job, placement, tuple(range(job.count)), job_put=job)
            t1 = time.perf_counter()
            state.snapshot()
            t2 = time.perf_counter()
            commit_ms.append(1000 * (t2 - t0))
            apply_ms.append(1000 * (t2 - t1))
            written += len(placement.claims)
        elapsed, cpu = time.perf_counter() - t_start, time.process_time() - c_start
    return Run(len(jobs) / elapsed, len(jobs) / cpu, failed, commit_ms, apply_ms, written, pauses)


def _kept(run) -> int:
    """Bytes of Python objects that `run()` leaves alive (tracemalloc, tracing since before the
    region was built: allocations less frees, the records a commit replaces included; a full
    collection after it), whatever the run's peak was."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    run()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


def memory(sizes: list[int], jobs: int, seed: int) -> int:
    """--memory: per size, the bytes a committed task leaves in memory: (2), the daemon's commit
    path (its region view, with the allocator's snapshot brought up to date, and the scheduler's
    state; what each replica's view holds of a task is all of it but the scheduler's part); against
    (1), the same jobs applied to a copy of the snapshot alone. Python objects only (tracemalloc):
    resident memory also holds what the allocator has not given back."""
    print(f"Python {platform.python_version()}; jobs of {TASKS_PER_JOB} tasks, {jobs} a run; bytes left in memory "
          f"a task committed (tracemalloc)")
    for n in sizes:
        tracemalloc.start()  # before the region is built: what a commit frees of it counts too
        try:
            b2, b1 = _memory_at(n, jobs, seed)
        finally:
            tracemalloc.stop()
        print(f"  {n:>9,} machines: (2) the daemon's commit path {b2:,.0f} bytes a task; (1) the snapshot alone "
              f"{b1:,.0f} (ratio {b2 / b1:.1f})")
        gc.collect()
    return 0


def _memory_at(n: int, jobs: int, seed: int) -> tuple[float, float]:
    """memory() at one size: bytes a task, (2) and (1). The region goes with the call."""
    state, _ = build_state(n, random.Random(seed))
    copy = state.snapshot().copy()
    placed = [0, 0]

    def one() -> None:
        r = into_snapshot(copy, make_jobs(random.Random(seed + 2), jobs, "job"))
        placed[0] = (jobs - r.failed) * TASKS_PER_JOB

    def two() -> None:
        r = asyncio.run(through_the_daemon(state, make_jobs(random.Random(seed + 2), jobs, "job")))
        placed[1] = (jobs - r.failed) * TASKS_PER_JOB

    b1 = _kept(one) / max(1, placed[0])
    return _kept(two) / max(1, placed[1]), b1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000", help="machine counts, comma separated")
    ap.add_argument("--jobs", type=int, default=1000, help="jobs per measured run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--default-gc", action="store_true", help="leave the garbage collector as CPython sets it")
    ap.add_argument("--memory", action="store_true",
                    help="instead: what each committed task leaves in memory, (2) against (1), by tracemalloc")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.memory:
        return memory(sizes, args.jobs, args.seed)
    if not args.default_gc:
        tune_collector()
    print(f"Python {platform.python_version()}, one process, one core; jobs of {TASKS_PER_JOB} tasks, "
          f"{args.jobs} a run; no etcd; garbage collector thresholds {gc.get_threshold()} "
          + ("(CPython's default)" if args.default_gc else f"(as twine-controld sets them: a full pass every {FULL_EVERY})"))
    rows = []
    for n in sizes:
        rnd = random.Random(args.seed)
        t0 = time.perf_counter()
        state, shape = build_state(n, rnd)
        t1 = time.perf_counter()
        snap = state.snapshot()  # the first one is built from the records (and frozen out of the gc)
        t2 = time.perf_counter()
        copy = snap.copy()
        gc.freeze()  # the copy too, as RegionState freezes the snapshot it built
        held = sum(snap.held(e) for e in snap.entitlements)
        print(f"\n{n:,} machines ({DCS} dcs, {shape['msbs']} msbs, {shape['racks']:,} racks; {held:,} held, "
              f"{sum(len(t) for t in state.tasks.values()):,} tasks): records built in {t1 - t0:.1f} s, "
              f"snapshot in {t2 - t1:.1f} s, a copy for (1) in {time.perf_counter() - t2:.1f} s")
        base, base_cpu, base_failed = allocate_only(snap, make_jobs(random.Random(args.seed + 1), args.jobs, "probe"))
        print(f"  baseline, allocation alone:       {base:8,.0f} jobs/s ({base_cpu:,.0f} per cpu second"
              + (f"; {base_failed} did not fit" if base_failed else "") + ")")
        one = into_snapshot(copy, make_jobs(random.Random(args.seed + 2), args.jobs, "job"))
        print(f"  (1) allocate + commit to snapshot: {one.line(base)}")
        print(f"      {one.costs()}")
        print(f"      {one.gc()}")
        del copy
        two = asyncio.run(through_the_daemon(state, make_jobs(random.Random(args.seed + 2), args.jobs, "job")))
        print(f"  (2) allocate + daemon commit path (no etcd; one transaction a job): {two.line(base)}")
        print(f"      {two.costs()}; of which state.snapshot(): p50 {pct(two.apply_ms, 0.5):.3f} ms, "
              f"p99 {pct(two.apply_ms, 0.99):.3f} ms")
        print(f"      {two.gc()}")
        rows.append((n, base, one, two))
        del state, snap
        gc.unfreeze()  # what is left of this size is garbage now
        gc.collect()
    n0, _, one0, two0 = rows[0]

    def per_machine(run: Run) -> float:  # a commit's p50 over the machines it writes on average
        return pct(run.commit_ms, 0.5) / (run.machines_written / len(run.commit_ms))

    print(f"\ncommit cost per machine placed on (p50 over the mean machines a commit places tasks on: the commit's work "
          f"follows them, and jobs spread over more of them in a larger region), against {n0:,} machines:")
    for n, _, one, two in rows:
        print(f"  {n:>9,} machines: (1) {1000 * per_machine(one):.1f} us x{per_machine(one) / per_machine(one0):.2f}, "
              f"(2) {1000 * per_machine(two):.1f} us x{per_machine(two) / per_machine(two0):.2f}")
    print(f"commit cost against {n0:,} machines (p50 / p99 ratio; 1.00 = flat):")
    for n, base, one, two in rows:
        print(f"  {n:>9,} machines: (1) x{pct(one.commit_ms, 0.5) / pct(one0.commit_ms, 0.5):.2f} / "
              f"x{pct(one.commit_ms, 0.99) / pct(one0.commit_ms, 0.99):.2f}, "
              f"(2) x{pct(two.commit_ms, 0.5) / pct(two0.commit_ms, 0.5):.2f} / "
              f"x{pct(two.commit_ms, 0.99) / pct(two0.commit_ms, 0.99):.2f}; jobs/s: baseline {base:,.0f}, "
              f"(1) {one.jobs_per_s:,.0f}, (2) {two.jobs_per_s:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
