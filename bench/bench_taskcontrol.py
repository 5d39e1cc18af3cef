"""Paper section 5.1 (Figure 14) at full size: a rolling update of a sharded cache with its
TaskController, and an MSB failure in the middle of it.

15,000 shards with 3 replicas each on 1,000 tasks (one per machine; 20 MSBs of 50 machines). The
job is updated; at `--fail-at` seconds into the update one MSB fails, killing its 50 tasks, and
comes back `--fail-for` seconds later. The control plane is the real one, in this process: etcd,
RegionState, the scheduler (reconciler, allocator, guarded commits), the health check, and the
TaskControl session calling the reference replica-aware controller over HTTP. Only the agents and
their containers are simulated: bench/fake_runtime.py (a FAKE runtime; a restart takes
`--restart` seconds, the paper's took about 120).

Sampled every 50 ms from the fake runtime's containers (ground truth, not the scheduler's view):
shards with one replica down, with two or more down, and with two or more down not counting the
failed tasks ("outside the injected failure"; the paper: zero). Baseline, in the same run: the
same update and the same failure with the built-in policy instead of a controller (a static
max-unavailable equal to the controller's first batch: the same speed, no shard knowledge).

    .venv/bin/python bench/bench_taskcontrol.py [--shards 15000] [--tasks 1000] [--replicas 3]

`--sweep` runs the controller alone over every combination of the `--sweep-*` lists (sizes, when
the failure comes, how long it lasts, restart durations, seeds; 15 shards a task, MSBs of
tasks // 20 machines, the middle one failing) and prints a row per case, then the worst of each
column: the paper's claim is 0 shards with two live replicas down, everywhere. A case whose update
was done before the failure, or whose failure the health check never saw, tested nothing of it
and is counted apart. Each batch the controller approves is also checked as it is approved
(CheckedReplicaAware) against the shard map and what the controller was told: an operation that
would take a shard past one replica down by those counts as unsafe. Exit status 1 (without
--sweep too, for the controller's run) if any case has a shard with two live replicas down, or an unsafe
operation.

    .venv/bin/python bench/bench_taskcontrol.py --sweep [--sweep-tasks 100,300,1000] ...
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fake_runtime import FakeRuntime  # noqa: E402
from controlplane.store.etcdproc import EtcdServer  # noqa: E402
from controlplane.health.check import HealthService  # noqa: E402
from controlplane.store.records import EntitlementRec, JobRec, MachineRec  # noqa: E402
from controlplane.scheduler.ratelimit import Limits  # noqa: E402
from controlplane.scheduler.service import Scheduler  # noqa: E402
from controlplane.store.state import RegionState  # noqa: E402
from controlplane.store import Store, Versioned  # noqa: E402
from controlplane.store.keys import Keys  # noqa: E402
from controlplane.taskcontrol.controllers.replica_aware import ReplicaAware  # noqa: E402
from controlplane.taskcontrol.sdk import Background  # noqa: E402

MSB_SIZE = 50
TASK = {"image": "twine/cache:1", "command": ["cache"], "env": {"V": "1"}, "cpus": 1.0, "memory_mb": 512,
        "pids": 256, "network_mode": "bridge"}


def shard_map(shards: int, msb_of_task: dict[int, str], replicas: int, seed: int) -> dict[str, list[int]]:
    """Shard Manager's placement over fault domains: the MSBs fall into `replicas` groups and each
    shard has one replica in each group (a random task there), so one MSB failure takes down at
    most one replica of any shard, and a whole group could restart at once."""
    rng = random.Random(seed)
    msbs = sorted(set(msb_of_task.values()))
    group_of = {msb: n % replicas for n, msb in enumerate(msbs)}
    groups: list[list[int]] = [[] for _ in range(replicas)]
    for t, msb in sorted(msb_of_task.items()):
        groups[group_of[msb]].append(t)
    return {f"s{n}": [rng.choice(g) for g in groups] for n in range(shards)}


@dataclass
class Result:
    name: str
    duration: float = 0.0
    first_batch: int = 0
    peak_one_down: int = 0
    peak_two_down: int = 0  # counting every task down, the failed ones too
    peak_two_down_outside: int = 0  # not counting the failed tasks
    # counting the failed tasks, once the controller could know: the batch in flight at the failure
    # is done, and so is every operation approved before the health check saw the failure
    two_down_after_batch: int = 0
    failure_detected_after: float = 0.0  # 0: never seen by the health check
    updated_at_failure: int = 0  # tasks at the new version when the MSB failed
    # the longest a 10 ms sleep overslept during the update: how late any task of the daemon's
    # event loop (the health check's pass among them) could run past its time
    longest_stall: float = 0.0
    heartbeat_timeout: float = 0.0
    batches: int = 0  # batches the controller approved, each checked against the shard map
    unsafe: int = 0  # approved operations that would take a shard past one replica down
    unsafe_example: str = ""
    samples: int = 0
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)


class CheckedReplicaAware(ReplicaAware):
    """The reference controller, each batch it approves checked as it decides (in its own thread,
    under its lock) against the shard map, indexed here apart from the controller's own index,
    and against what the controller was told: an approved operation on a running task may take
    none of its shards past `max_down` replicas down, counting the tasks told unhealthy, those
    approved earlier and not completed, and the others of the same batch. This catches a wrong decision, not a task down that the
    controller was not told of: the 2+-down columns, sampled from the fake runtime's containers,
    are the ground truth for that."""

    def __init__(self, shards, max_down: int = 1):
        super().__init__(shards, max_down)
        self.mates: dict[int, list[str]] = {}  # task -> its shards' names, from the map itself
        for name, replicas in shards.items():
            for t in replicas:
                self.mates.setdefault(t, []).append(name)
        self.batches = self.unsafe = 0
        self.example = ""

    def decide(self, request):
        approved = super().decide(request)
        if not approved:
            return approved
        self.batches += 1
        by_id = {op.id: op.index for op in request.ops}
        down = request.unhealthy_indices() | {op.index for op in self.in_flight.values()}
        hit: dict[str, int] = {}  # shard -> replicas going down with this batch, or down already
        for t in down:
            for sh in self.mates.get(t, ()):
                hit[sh] = hit.get(sh, 0) + 1
        for op_id in approved:
            t = by_id[op_id]
            if t in down:
                continue  # down anyway: takes no further replica down
            for sh in self.mates.get(t, ()):
                hit[sh] = hit.get(sh, 0) + 1
                if hit[sh] > self.max_down:
                    self.unsafe += 1
                    self.example = self.example or f"task {t}, shard {sh}, sequence {request.sequence}"
                    break
        return approved


class ShardCounter:
    def __init__(self, shards: dict[str, list[int]]):
        self.by_task: dict[int, list[int]] = {}
        for n, replicas in enumerate(shards.values()):
            for t in replicas:
                self.by_task.setdefault(t, []).append(n)

    def down_counts(self, down: set[int]) -> dict[int, int]:
        count: dict[int, int] = {}
        for t in down:
            for sh in self.by_task.get(t, ()):
                count[sh] = count.get(sh, 0) + 1
        return count


async def scenario(args: argparse.Namespace, controlled: bool, max_unavailable: int) -> Result:
    name = "replica-aware TaskController" if controlled else f"built-in policy, max_unavailable {max_unavailable}"
    res = Result(name, heartbeat_timeout=args.heartbeat_timeout)
    etcd = EtcdServer().start()
    store = Store([("127.0.0.1", etcd.port)])
    keys = Keys("bench")
    state = RegionState(store, keys)
    mids = [f"m{i:04d}" for i in range(args.tasks)]
    msbs = {mid: f"msb{i // args.msb_size:02d}" for i, mid in enumerate(mids)}
    try:
        for i in range(0, len(mids), 200):
            await store.commit([], {keys.machine(mid): MachineRec(
                mid, mid, {"region": "bench", "dc": "dc1", "msb": msbs[mid], "rack": f"r{int(mid[1:]) // 10}",
                           "machine_type": "generic"}, {"cpus": 1.0, "memory_mb": 1024}).to_json()
                for mid in mids[i:i + 200]})
        await store.commit([], {keys.entitlement("cache"): EntitlementRec("cache", "generic", args.tasks, allow_controller_networks=("127.0.0.0/8",)).to_json()})
        await state.start()
        watch = asyncio.create_task(state.index.watching())
        runtime = FakeRuntime(state, mids, (args.restart * 0.8, args.restart * 1.2), seed=args.seed)
        health = HealthService(state, store, keys, runtime.last_seen, timeout=args.heartbeat_timeout)
        # a revived machine clears its tombstones: the FAKE runtime's report is current whenever it is read
        health.report_of = lambda mid: (runtime.reports(mid), time.time())
        unlimited = Limits.parse("job=100000:100000,shard=100000:100000,region=100000:100000")
        scheduler = Scheduler(state, store, keys, runtime.reports, limits=unlimited, taskcontrol_interval=0.5)
        job = JobRec("cache", "shards", args.tasks, TASK, max_unavailable=max_unavailable)
        await scheduler.create(job, 0)
        # the shards go where the tasks landed: replicas in distinct MSBs
        shards = shard_map(args.shards, {i: msbs[t.machine] for i, t in state.tasks[job.handle].items()},
                           args.replicas, args.seed)
        controller = CheckedReplicaAware(shards)
        counter = ShardCounter(shards)
        with Background(controller) as url:
            loops = [asyncio.create_task(c) for c in (runtime.run(), health.run(), scheduler.run(), stalls(res))]
            try:
                await wait_for(lambda: len(runtime.up(job.handle)) == args.tasks, 120, "the job running")
                print(f"  {name}: {args.tasks} tasks running; updating", flush=True)
                await run_update(args, res, state, scheduler, runtime, counter, job, msbs, url if controlled else None)
            finally:
                res.batches, res.unsafe, res.unsafe_example = controller.batches, controller.unsafe, controller.example
                for t in (*loops, watch):
                    t.cancel()
                await asyncio.wait([*loops, watch], timeout=10)
        logging.getLogger().info("%s: scheduler counters %s", name, scheduler.counters)
    finally:
        try:
            await asyncio.wait_for(state.stop(), 10)
            await asyncio.wait_for(store.close(), 10)
        except TimeoutError:
            logging.getLogger().warning("teardown timed out")
        etcd.stop()
    return res


async def stalls(res: Result) -> None:
    while True:
        t = time.monotonic()
        await asyncio.sleep(0.01)
        res.longest_stall = max(res.longest_stall, time.monotonic() - t - 0.01)


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def run_update(args, res: Result, state: RegionState, scheduler: Scheduler, runtime: FakeRuntime,
                     counter: ShardCounter, job: JobRec, msbs: dict[str, str], controller: str | None) -> None:
    handle = job.handle
    victims = [mid for mid, msb in msbs.items() if msb == args.fail_msb]
    failed_tasks = {t.index for t in state.tasks[handle].values() if t.machine in victims}
    new = replace(job, task={**TASK, "env": {"V": "2"}}, spec_version=job.spec_version + 1, controller=controller)
    key = scheduler.keys.job(handle)  # as the API's PUT: guarded by the revision the job was read at
    await state.wait_for(await scheduler.store.commit([Versioned(key, None, state.revs[key])], {key: new.to_json()}))
    t0 = time.monotonic()
    res.longest_stall = 0.0  # the stalls of the update, not of the job's start before it
    failed_at = revived_at = None
    in_flight_at_failure: set[int] = set()
    batch_done_at = None
    detected = False
    approved_blind: set[int] = set()
    while True:
        now = time.monotonic() - t0
        up = runtime.up(handle)
        down = set(range(args.tasks)) - set(up)
        if failed_at is None and now >= args.fail_at:
            in_flight_at_failure = down.copy()
            runtime.kill(victims)
            failed_at = now
            res.updated_at_failure = sum(1 for v in up.values() if v == new.spec_version)
            down |= failed_tasks
        if failed_at is not None and revived_at is None and now >= failed_at + args.fail_for:
            runtime.revive(victims)
            revived_at = now
        if failed_at is not None and not detected and all(
                not state.machines[m].healthy for m in victims):
            detected = True
            res.failure_detected_after = now - failed_at
            approved_blind = down - failed_tasks  # what the controller approved before it knew
        if detected and batch_done_at is None and not ((in_flight_at_failure | approved_blind) & down - failed_tasks):
            batch_done_at = now
        counts = counter.down_counts(down)
        outside = counter.down_counts(down - failed_tasks)
        one = sum(1 for c in counts.values() if c == 1)
        two = sum(1 for c in counts.values() if c >= 2)
        two_out = sum(1 for c in outside.values() if c >= 2)
        res.samples += 1
        res.peak_one_down = max(res.peak_one_down, one)
        res.peak_two_down = max(res.peak_two_down, two)
        res.peak_two_down_outside = max(res.peak_two_down_outside, two_out)
        if batch_done_at is not None and (revived_at is None or now < revived_at):
            res.two_down_after_batch = max(res.two_down_after_batch, two)
        if now < args.restart * 0.8:  # before any restart can have finished: the first batch
            res.first_batch = max(res.first_batch, len(down - failed_tasks))
        res.timeline.append((round(now, 2), len(down), one, two))
        if args.progress and res.samples % int(args.progress / 0.05) == 0:
            updated = sum(1 for v in up.values() if v == new.spec_version)
            print(f"    t={now:6.1f}s  updated {updated:5d}  down {len(down):4d}  shards 1 down {one:6d}  "
                  f"2+ down {two:5d} (outside the failure {two_out})", flush=True)
        if len(up) == args.tasks and all(v == new.spec_version for v in up.values()) and revived_at is not None:
            res.duration = now
            print(f"  {res.name}: done at t={now:.1f}s", flush=True)
            return
        if now > args.timeout:
            raise SystemExit(f"{res.name}: the update did not finish in {args.timeout} s "
                             f"({sum(1 for v in up.values() if v == new.spec_version)} of {args.tasks} updated)")
        await asyncio.sleep(0.05)


def report(r: Result) -> None:
    print(f"  {r.name}")
    print(f"    update done, and the MSB back, after          {r.duration:8.1f} s")
    print(f"    first batch (tasks down at once)              {r.first_batch:8d}")
    print(f"    peak shards with 1 replica down               {r.peak_one_down:8d}")
    print(f"    peak shards with 2+ down, failure included    {r.peak_two_down:8d}")
    print(f"    peak shards with 2+ down outside the failure  {r.peak_two_down_outside:8d}   (paper: 0)")
    print(f"    peak shards with 2+ down, failure included, once what was approved before the health check "
          f"saw the failure was done: {r.two_down_after_batch}   (paper: 0)")
    detected = f"{r.failure_detected_after:8.2f} s" if r.failure_detected_after else "   never  "
    print(f"    failure detected by the health check after    {detected}   (every failed machine "
          f"unhealthy; heartbeat timeout {r.heartbeat_timeout:g} s)")
    print(f"    longest event loop stall                      {r.longest_stall:8.2f} s")
    if r.batches:
        print(f"    approved batches checked, as approved, against the shard map and what the controller was told: "
              f"{r.batches}; operations taking a shard past one replica down: {r.unsafe}"
              + (f" (first: {r.unsafe_example})" if r.unsafe else ""))


def sweep(args: argparse.Namespace) -> int:
    for name in ("twine.controld.health", "twine.controld.scheduler"):
        logging.getLogger(name).setLevel(logging.ERROR)
    floats = lambda text: [float(x) for x in text.split(",") if x]  # noqa: E731
    cases = [(int(n), at, length, restart, int(seed)) for n in floats(args.sweep_tasks) for at in floats(args.sweep_fail_at)
             for length in floats(args.sweep_fail_for) for restart in floats(args.sweep_restart)
             for seed in floats(args.sweep_seeds)]
    print(f"sweep: {len(cases)} cases of the replica-aware controller (FAKE runtime), {args.replicas} replicas, "
          f"15 shards a task, MSBs of tasks // 20 machines, the middle one failing")
    print(f"{'tasks':>6} {'fail at':>8} {'for':>5} {'restart':>8} {'seed':>5} | {'done at':>7} {'batch':>6} "
          f"{'updated at failure':>18} {'2+ down outside':>16} {'2+ down once known':>19} {'detected':>9} {'stall':>6} "
          f"{'batches':>7} {'unsafe':>6}")
    results = []
    for n, at, length, restart, seed in cases:
        msb_size = max(1, n // 20)
        case = replace_args(args, tasks=n, shards=15 * n, fail_at=at, fail_for=length, restart=restart, seed=seed,
                            msb_size=msb_size, fail_msb=f"msb{(n // msb_size) // 2:02d}", progress=0)
        r = asyncio.run(scenario(case, True, 1))
        print(f"{n:6d} {at:7.1f}s {length:4.0f}s {restart:7.1f}s {seed:5d} | {r.duration:6.1f}s {r.first_batch:6d} "
              f"{r.updated_at_failure:18d} {r.peak_two_down_outside:16d} {r.two_down_after_batch:19d} "
              + (f"{r.failure_detected_after:8.2f}s" if r.failure_detected_after else "    never")
              + f" {r.longest_stall:5.2f}s {r.batches:7d} {r.unsafe:6d}", flush=True)
        results.append((r, (n, at, length, restart, seed)))
    untested = [c for r, c in results if r.updated_at_failure >= c[0] or not r.failure_detected_after]
    for what, value in (("outside the failure", lambda r: r.peak_two_down_outside),
                        ("once the failure was known", lambda r: r.two_down_after_batch)):
        r, c = max(results, key=lambda rc: value(rc[0]))
        print(f"worst, {what}: {value(r)} shards with 2+ live replicas down (tasks, fail at, for, restart, seed = {c}); "
              f"paper: 0")
    seen = [(r, c) for r, c in results if r.failure_detected_after]
    if seen:
        r, c = max(seen, key=lambda rc: rc[0].failure_detected_after)
        print(f"slowest detection: every failed machine unhealthy {r.failure_detected_after:.2f} s after the failure "
              f"(heartbeat timeout {args.heartbeat_timeout:g} s; case {c})")
    r, c = max(results, key=lambda rc: rc[0].longest_stall)
    print(f"longest event loop stall: {r.longest_stall:.2f} s (case {c})")
    print(f"cases that tested no failure during the update (done before it, or never detected): {len(untested)}"
          + (f" {untested}" if untested else ""))
    print(f"approved batches checked, as approved, against the shard map and what the controller was told: "
          f"{sum(r.batches for r, _ in results)}; operations taking a shard past one replica down: "
          f"{sum(r.unsafe for r, _ in results)}")
    return 1 if any(r.peak_two_down_outside or r.two_down_after_batch or r.unsafe for r, _ in results) else 0


def replace_args(args: argparse.Namespace, **changes) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=15_000)
    p.add_argument("--tasks", type=int, default=1_000)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--restart", type=float, default=5.0, help="seconds a task takes to restart (+-20%%)")
    p.add_argument("--fail-at", type=float, default=2.0, help="seconds into the update the MSB fails")
    p.add_argument("--fail-for", type=float, default=15.0, help="seconds the MSB stays down")
    p.add_argument("--fail-msb", default="msb07")
    p.add_argument("--msb-size", type=int, default=MSB_SIZE, help="machines per MSB (the failure kills one MSB)")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--progress", type=float, default=0, metavar="S", help="print a line every S seconds")
    p.add_argument("--sweep", action="store_true", help="the controller alone over the --sweep-* lists")
    p.add_argument("--sweep-tasks", default="100,300,1000")
    p.add_argument("--sweep-fail-at", default="0.5,2,4", help="seconds into the update")
    p.add_argument("--sweep-fail-for", default="3,15", help="seconds the MSB stays down")
    p.add_argument("--sweep-restart", default="1,5", help="seconds a task takes to restart")
    p.add_argument("--sweep-seeds", default="1,2")
    args = p.parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.sweep:
        sys.exit(sweep(args))
    print(f"paper 5.1: {args.shards} shards x {args.replicas} replicas on {args.tasks} tasks; "
          f"{args.fail_msb} ({args.msb_size} tasks) fails {args.fail_at:g} s into the update for {args.fail_for:g} s; "
          f"restart {args.restart:g} s (FAKE runtime)")
    for name in ("twine.controld.health", "twine.controld.scheduler"):  # 50 machines fail, return: expected
        logging.getLogger(name).setLevel(logging.ERROR)
    controlled = asyncio.run(scenario(args, True, 1))
    report(controlled)
    baseline = asyncio.run(scenario(args, False, max(controlled.first_batch, 1)))
    report(baseline)
    print("  ratios (controller / baseline)")
    print(f"    update duration                               {controlled.duration / baseline.duration:8.2f}x")
    print(f"    peak shards with 2+ down outside the failure  "
          f"{controlled.peak_two_down_outside} vs {baseline.peak_two_down_outside}")
    # as the sweep: the controller's run fails on a shard with two live replicas down, or an unsafe operation
    return 1 if controlled.peak_two_down_outside or controlled.two_down_after_batch or controlled.unsafe else 0


if __name__ == "__main__":
    sys.exit(main())
