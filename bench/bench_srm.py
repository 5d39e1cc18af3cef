"""The SRM against a static size and the Kubernetes HPA, on a load trace, side by side (issue #26).

A simulated region on a simulated clock (a week runs in minutes; no daemon, no containers: the
recommender is pure). Each job is its own entitlement; machines hold SLOTS tasks of 1 cpu; a job's
growth stacks on its entitlement's machines, then takes machines from the free pool; a machine left
with no task goes back to the pool. Three policies on the same trace:

- static: ceil(the job's peak load / target) tasks all week;
- hpa: Kubernetes' HPA algorithm with its documented defaults (bench/hpa.py, tested in
  tests/bench/test_hpa.py); its scale-ins stop the pods a ReplicaSet would (not ready first, then
  those on the machines holding most of its pods, newest first); no cluster autoscaler;
- srm: controlplane/srm/ as the daemon runs it: recommend() with the job's Memory, the forecast
  from a usage Series (history.py) fed as the Recorder feeds it, victims.choose() for scale-ins.

Both autoscalers decide every 15 s, see load MEASURE_DELAY seconds old (what the tasks used: at
most one core each), and new tasks serve STARTUP seconds after they are asked for. The srm's
history is the trace played once before the measured week (a job that ran last week too). The
built-in trace: a diurnal week (trough at 05:00, peak at 20:00, weekends at 80 %), AR(1) noise, a
flash crowd at 3x for 30 minutes (Thursday 11:00) and a 20-minute metrics outage (Friday 07:00,
the morning's rise): no measurement reaches either autoscaler. Each job's load is the trace at a
scale of 0.5-1.5 and shifted by up to 3 hours, with noise of its own.

Over-target minute: a minute whose load per serving task exceeded target x 1.1. Machine-hours:
the machines the jobs' entitlements held. Task starts+stops: tasks added and removed.

    .venv/bin/python bench/bench_srm.py [--trace FILE] [--jobs 10] [--machines 1000] [--days 7]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controlplane.srm.forecast import EVERY as FORECAST_EVERY, refresh  # noqa: E402
from controlplane.srm.recommend import Memory, Reading, recommend  # noqa: E402
from controlplane.srm.victims import choose  # noqa: E402
from controlplane.store.autoscale import Autoscale  # noqa: E402
from controlplane.store.records import TaskRec  # noqa: E402
from controlplane.usage.history import Series  # noqa: E402
from hpa import Hpa  # noqa: E402

STEP = 15.0  # seconds between decisions: HPA's sync period, the SRM's --srm-interval
MEASURE_DELAY = 30.0  # seconds between the load and its measurement reaching the autoscaler
STARTUP = 60.0  # seconds from a task asked for to a task serving
SLOTS = 4  # tasks (of 1 cpu) a machine holds
TARGET = 0.6
SAMPLE = 10.0  # the daemon's --usage-sample (its stale_after: 2 x STEP + SAMPLE)
WEEK = 7 * 24 * 60
T0 = 2 * WEEK * 60  # the measured week's start on the clock the history keeps (a Monday, 00:00)
POLICY = Autoscale(min=2, max=1000, target_cpu=TARGET, tolerance=0.1, predictive=True, scale_down_after=300,
                   max_changes_per_hour=6)


# -- the trace ---------------------------------------------------------------------------------

def builtin_trace(seed: int, flash: bool = True) -> tuple[list[float], list[tuple[int, int]]]:
    """Cores a minute for a week (a job of about 40 cores at peak), and the outage (minutes).
    Without `flash`: the week before (no flash crowd: nobody saw it coming)."""
    rng = random.Random(seed)
    out, noise = [], 0.0
    for m in range(WEEK):
        day, hour = divmod(m / 60, 24)
        rise = 0.5 - 0.5 * math.cos(2 * math.pi * ((hour - 5) % 24) / 30) if (hour - 5) % 24 < 15 else \
            0.5 + 0.5 * math.cos(math.pi * ((hour - 20) % 24) / 9)
        load = 40 * (0.25 + 0.75 * rise) * (0.8 if day >= 5 else 1.0)
        noise = 0.9 * noise + rng.gauss(0, 0.03)
        out.append(load * (1 + noise))
    at = 3 * 1440 + 11 * 60
    for m in range(at, at + 30 if flash else at):
        out[m] *= 3
    outage = 4 * 1440 + 7 * 60
    return out, [(outage, outage + 20)]


def read_trace(path: str) -> list[float]:
    """A CSV of `seconds,load` (load: cores), as load a minute (the last value before each minute)."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or not row[0].strip() or row[0].strip().startswith("#"):
                continue
            try:
                rows.append((float(row[0]), float(row[1])))
            except (ValueError, IndexError):
                if rows:
                    raise SystemExit(f"{path}: {row!r} is not seconds,load") from None
    if not rows:
        raise SystemExit(f"{path}: no seconds,load rows")
    rows.sort()
    out, i = [], 0
    for m in range(int(rows[-1][0] // 60) + 1):
        while i + 1 < len(rows) and rows[i + 1][0] <= m * 60:
            i += 1
        out.append(max(0.0, rows[i][1]))
    return out


def job_loads(base: list[float], jobs: int, seed: int, noise_seed: int) -> list[list[float]]:
    """Each job's load: the trace at its own scale and shift (from `seed`: the same jobs whatever
    the noise), with noise of its own (from `noise_seed`)."""
    shape, rng = random.Random(seed + 1), random.Random(noise_seed)
    out = []
    for j in range(jobs):
        scale, shift = (1.0, 0) if jobs == 1 else (shape.uniform(0.5, 1.5), shape.randint(-180, 180))
        noise, series = 0.0, []
        for m in range(len(base)):
            noise = 0.8 * noise + rng.gauss(0, 0.02)
            series.append(max(0.0, base[(m + shift) % len(base)] * scale * (1 + noise)))
        out.append(series)
    return out


# -- one job's machines ------------------------------------------------------------------------

class Pool:
    def __init__(self, machines: int):
        self.free, self.held, self.next_id = machines, 0, 0
        self.refused = 0  # tasks not placed: the pool was empty

    def take(self) -> str | None:
        if self.free == 0:
            self.refused += 1
            return None
        self.free -= 1
        self.held += 1
        self.next_id += 1
        return f"m{self.next_id}"

    def give(self) -> None:
        self.free += 1
        self.held -= 1


class JobSim:
    """One job's tasks on its entitlement's machines."""

    def __init__(self, pool: Pool, name: str):
        self.pool, self.name = pool, name
        self.tasks: dict[int, tuple[str, float]] = {}  # index -> (machine, serving from)
        self.machines: dict[str, set[int]] = {}
        self.starts = self.stops = 0

    def size(self) -> int:
        return len(self.tasks)

    def serving(self, now: float) -> int:
        return sum(1 for _, at in self.tasks.values() if at <= now)

    def grow(self, n: int, now: float) -> None:
        free = sorted((m for m, ts in self.machines.items() if len(ts) < SLOTS), key=lambda m: -len(self.machines[m]))
        index = 0
        for _ in range(n):
            while index in self.tasks:
                index += 1
            if not free:
                m = self.pool.take()
                if m is None:
                    return  # the pool is empty: the task is not placed
                self.machines[m] = set()
                free.append(m)
            m = free[0]
            self.machines[m].add(index)
            self.tasks[index] = (m, now + STARTUP)
            self.starts += 1
            if len(self.machines[m]) >= SLOTS:
                free.pop(0)

    def stop(self, indices) -> None:
        for i in indices:
            m, _ = self.tasks.pop(i)
            self.machines[m].discard(i)
            self.stops += 1
            if not self.machines[m]:
                del self.machines[m]
                self.pool.give()

    def srm_victims(self, k: int, now: float) -> list[int]:
        recs = {i: TaskRec(self.name, i, 1, {}, m, "running" if at <= now else "starting")
                for i, (m, at) in self.tasks.items()}
        on = {m: len(ts) for m, ts in self.machines.items()}
        return choose(recs, sorted(self.tasks), on, k)

    def replicaset_victims(self, k: int, now: float) -> list[int]:
        """A ReplicaSet's scale-down order: not ready first, then pods on the machines holding the
        most of its pods, then the newest."""
        def key(i: int) -> tuple:
            m, at = self.tasks[i]
            return (at <= now, -len(self.machines[m]), -at)
        return sorted(self.tasks, key=key)[:k]


# -- the run -----------------------------------------------------------------------------------

class Result:
    def __init__(self, name: str):
        self.name = name
        self.machine_seconds = 0.0
        self.over = 0
        self.changes = 0
        self.stale_scale_ins = 0
        self.resizes = 0


def warm_history(load: list[float], minutes: int) -> Series:
    """The job's usage history as the Recorder keeps it: the trace played once before."""
    s = Series()
    base = T0 // 60 - len(load)
    for m in range(minutes):
        s.put_minute(base + m, round(load[m % len(load)] * 1000), 64)
        if (m + 1) % 60 == 0:
            s.close_hour((base + m) // 60)
    return s


def simulate(loads: list[list[float]], history: list[list[float]], outages: list[tuple[int, int]], machines: int,
             minutes: int) -> tuple[list[Result], dict]:
    static, hpa_r, srm_r = Result("static"), Result("hpa"), Result("srm")
    pools = {"hpa": Pool(machines), "srm": Pool(machines)}
    jobs = []
    for j, load in enumerate(loads):
        n0 = max(POLICY.min, math.ceil(load[0] / TARGET))
        peak_tasks = math.ceil(max(load[:minutes]) / TARGET)
        static.machine_seconds += math.ceil(peak_tasks / SLOTS) * minutes * 60
        h, s = JobSim(pools["hpa"], f"j{j}/api"), JobSim(pools["srm"], f"j{j}/api")
        h.grow(n0, -STARTUP)
        s.grow(n0, -STARTUP)
        h.starts = s.starts = 0
        jobs.append({"load": load, "hpa": h, "srm": s, "auto": Hpa(POLICY.min, POLICY.max, TARGET),
                     "mem": Memory(), "series": warm_history(history[j], len(history[j])),
                     "ready": {"hpa": [], "srm": []}})
    stale_after = 2 * STEP + SAMPLE
    srm_cpu, srm_calls = 0.0, 0
    steps_per_minute = int(60 // STEP)
    down = set()
    for a, b in outages:
        down.update(range(a, b))
    for step in range(int(minutes * 60 // STEP)):
        now = step * STEP
        minute = int(now // 60)
        seen_at = now - MEASURE_DELAY
        seen_minute = int(seen_at // 60)
        outage = seen_minute in down or minute in down
        for job in jobs:
            load = job["load"]
            actual = load[minute]
            measured = None if outage else load[max(0, seen_minute)]
            for name, res in (("hpa", hpa_r), ("srm", srm_r)):
                sim: JobSim = job[name]
                ready = sim.serving(now)
                job["ready"][name].append(ready)
                size = sim.size()
                used = None if measured is None else min(measured, ready * 1.0)
                if name == "hpa":
                    per_pod = None if used is None or not ready else used / ready
                    new = job["auto"].desired(now, size, [per_pod] * ready, size - ready)
                    stale = False
                else:
                    began = time.process_time()
                    mem: Memory = job["mem"]
                    clock = T0 + now  # the history's clock
                    refresh(mem, job["series"], clock, mem.startup + STEP + SAMPLE)
                    reading = Reading(used, MEASURE_DELAY, ready) if used is not None else Reading(None, math.inf, ready)
                    d = recommend(POLICY, mem, clock, size, reading, TARGET, TARGET, None, stale_after)
                    srm_cpu += time.process_time() - began
                    srm_calls += 1
                    new, stale = d.size, d.stale
                    mem.ran(clock, ready)
                    if used is not None:
                        job["series"].sample(clock, round(used * 1000), 64)
                if new > size:
                    sim.grow(new - size, now)
                elif new < size:
                    victims = sim.srm_victims(size - new, now) if name == "srm" else sim.replicaset_victims(size - new, now)
                    sim.stop(victims)
                    if stale:
                        res.stale_scale_ins += 1
                if new != size:
                    res.resizes += 1
                    if name == "srm":
                        job["mem"].changed(T0 + now, size, sim.size())
        for name, res in (("hpa", hpa_r), ("srm", srm_r)):
            res.machine_seconds += pools[name].held * STEP
        if (step + 1) % steps_per_minute == 0:
            for job in jobs:
                actual = job["load"][minute]
                for name, res in (("hpa", hpa_r), ("srm", srm_r)):
                    r = job["ready"][name]
                    serving = sum(r) / len(r)
                    if actual / max(serving, 1e-9) > TARGET * 1.1:
                        res.over += 1
                    r.clear()
    for job in jobs:
        hpa_r.changes += job["hpa"].starts + job["hpa"].stops
        srm_r.changes += job["srm"].starts + job["srm"].stops
    return [static, hpa_r, srm_r], {"srm_cpu": srm_cpu, "srm_calls": srm_calls,
                                    "unplaced": {k: p.refused for k, p in pools.items()}}


def daemon_pass(jobs: int, tasks: int = 10) -> float:
    """Seconds of CPU per job of the daemon's own pass (srm/service.py Autoscaler.decide: the job's
    running tasks counted from the region's records, its reading from the usage sums, the quota's
    room, the forecast from its usage series, recommend()), on a RegionState fed in memory with
    `jobs` autoscaled jobs of `tasks` running tasks each (no etcd, no write: no job changes size)."""
    from types import SimpleNamespace

    from controlplane.srm.service import Autoscaler
    from controlplane.store.keys import Keys
    from controlplane.store.records import EntitlementRec, JobRec, MachineRec
    from controlplane.store.state import RegionState

    state = RegionState(None, Keys("bench"))  # its maps filled as a range read and the watch would
    task = {"image": "x", "command": [], "cpus": 1.0, "memory_mb": 64}
    state.machines["m0"] = MachineRec("m0", "m0", {"machine_type": "generic"}, {"cpus": 4.0, "memory_mb": 8192})
    series, usage = {}, {}
    for e in range(jobs // 10 + 1):
        state.entitlements[f"e{e}"] = EntitlementRec(f"e{e}", "generic", 100)
    week = Series()
    for hour in range((T0 // 60 - WEEK) // 60, T0 // 3600 + 1):
        week.put_hour(hour, (6000, 6000, 6000, 64, 64, 64))
    for j in range(jobs):
        job = JobRec(f"e{j // 10}", f"j{j}", tasks, task, autoscale=POLICY)
        state.jobs[job.handle] = job
        state.tasks[job.handle] = {i: TaskRec(job.handle, i, 1, task, "m0", "running") for i in range(tasks)}
        usage[job.handle] = [tasks * 600, tasks * 64, tasks]  # at the target: no change
        series[("job", job.handle)] = week  # the same history for each (its reading costs the same)
    led = SimpleNamespace(schedulers={0: object()}, scheduler_for=lambda handle: object())
    srm = Autoscaler(state, SimpleNamespace(jobs=lambda: usage), led, SimpleNamespace(series=series))
    srm._caps = {"generic": (4.0, 8192)}  # noqa: SLF001 - the pass over the machines is its own, now and then
    srm._caps_until = math.inf  # noqa: SLF001
    all_jobs = list(state.jobs.values())
    now = T0
    rounds = int(FORECAST_EVERY // STEP)  # a forecast is read once in as many passes
    began = time.process_time()
    for _ in range(rounds):
        now += STEP
        reserved: dict[str, list[float]] = {}
        for j in all_jobs:  # as tick() sums the entitlements' reservations
            r = reserved.setdefault(j.entitlement, [0.0, 0.0])
            r[0] += j.count
            r[1] += 64 * j.count
        for j in all_jobs:
            d = srm.decide(j, now, usage, reserved)
            assert d.size == j.count, d
    return (time.process_time() - began) / (rounds * jobs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", help="CSV of seconds,load (load: the job's total work in CPU cores)")
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--machines", type=int, default=1000)
    p.add_argument("--days", type=float, default=7.0, help="of the trace to measure (default the week)")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--daemon-jobs", type=int, default=20_000,
                   help="autoscaled jobs (of 10 tasks) the daemon's own per-job pass is measured on (0: not)")
    args = p.parse_args()
    if args.trace:
        base, outages = read_trace(args.trace), []
        before = base
        where = f"trace {args.trace} (the srm's history: the same trace, played before)"
    else:
        base, outages = builtin_trace(args.seed)
        before, _ = builtin_trace(args.seed + 1, flash=False)
        where = ("the built-in diurnal week (flash crowd 3x for 30 min, metrics outage 20 min; the srm's history: "
                 "the week before, other noise, no flash crowd)")
    minutes = min(len(base), int(args.days * 1440))
    began = time.perf_counter()
    loads = job_loads(base, args.jobs, args.seed, args.seed)
    history = job_loads(before, args.jobs, args.seed, args.seed + 2)
    (static, hpa_r, srm_r), cost = simulate(loads, history, outages, args.machines, minutes)
    wall = time.perf_counter() - began
    hours = minutes / 60
    print(f"{where}: {args.jobs} job(s), {args.machines} machines of {SLOTS} task slots, {hours:.0f} h measured "
          f"in steps of {STEP:g} s; target {TARGET} a task; load seen {MEASURE_DELAY:g} s late; tasks serve "
          f"{STARTUP:g} s after they are asked for; srm policy {POLICY.to_json()}")
    print(f"{'policy':8} {'machine-hours':>14} {'saved vs static':>16} {'over-target min':>16} "
          f"{'starts+stops':>13} {'resizes':>8} {'scale-ins on stale':>19}")
    for r in (static, hpa_r, srm_r):
        saved = 100 * (1 - r.machine_seconds / static.machine_seconds)
        print(f"{r.name:8} {r.machine_seconds / 3600:14.0f} {saved:15.1f}% {r.over:16d} {r.changes:13d} "
              f"{r.resizes:8d} {r.stale_scale_ins:19d}")
    if any(cost["unplaced"].values()):
        print(f"the free pool ran out: tasks not placed {cost['unplaced']} (give more --machines)")
    per = cost["srm_cpu"] / max(cost["srm_calls"], 1)
    print(f"srm recommender: {per * 1e6:.1f} us of CPU per job per interval (forecast and recommend(), "
          f"{cost['srm_calls']} calls); 100,000 autoscaled jobs every {STEP:g} s would take "
          f"{100 * per * 100_000 / STEP:.1f}% of one core")
    if args.daemon_jobs:
        per_job = daemon_pass(args.daemon_jobs)
        print(f"the daemon's pass (Autoscaler.decide, measured on {args.daemon_jobs} jobs of 10 tasks): "
              f"{per_job * 1e6:.1f} us of CPU per job per interval; 100,000 jobs every {STEP:g} s would take "
              f"{100 * per_job * 100_000 / STEP:.1f}% of one core")
    print(f"simulated in {wall:.0f} s of wall time; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    s_saved = 100 * (1 - srm_r.machine_seconds / static.machine_seconds)
    h_saved = 100 * (1 - hpa_r.machine_seconds / static.machine_seconds)
    print(f"srm: saved {s_saved:.0f}% machine-hours vs static (hpa {h_saved:.0f}%); over-target minutes {srm_r.over} "
          f"(hpa {hpa_r.over}); task starts+stops {srm_r.changes} (hpa {hpa_r.changes}); scale-ins on stale data "
          f"{srm_r.stale_scale_ins}")


if __name__ == "__main__":
    main()
