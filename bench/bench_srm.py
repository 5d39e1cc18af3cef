"""The SRM against the strongest Kubernetes autoscaling users run, on a load trace, side by side
(issues #26, #36).

A simulated region on a simulated clock (a week runs in seconds; no daemon, no containers: the
recommender is pure). Each job is its own entitlement; machines hold SLOTS tasks of 1 cpu; a job's
growth stacks on its entitlement's machines, then takes machines from the free pool; a machine left
with no task goes back to the pool at once (for every policy). The policies, on the same trace:

- static: each job at ceil(its 99th-percentile minute of load / target) tasks all week (static-peak:
  sized at the week's peak minute, flash crowd included, printed for reference);
- hpa: Kubernetes' HPA algorithm with its documented defaults (bench/hpa.py, tested in
  tests/bench/test_hpa.py); its scale-ins stop the pods a ReplicaSet would (not ready first, then
  those on the machines holding most of its pods, newest first); no node scale-down;
- hpa+ca: the same HPA with the Cluster Autoscaler's scale-down (bench/ca.py, tested in
  tests/bench/test_ca.py): a machine under half requested for 10 minutes whose tasks fit on the
  job's other machines is drained, one a scan every 10 s, its tasks started again best fit (each
  move a stop and a start, serving again STARTUP later);
- srm: controlplane/srm/ as the daemon runs it: recommend() with the job's Memory, the forecast from
  a usage Series (usage/history.py) fed as the Recorder feeds it (hourly rollups closed each hour),
  the reading as the daemon makes it from the tasks that report (usage_reading), victims.frees()
  for the sizes at which a scale-in empties a machine and victims.choose() for its stops;
  srm-nopred: the same with predictive off;
- srm@A (with --aim A,...): the srm sizing tasks for load per task of target x A, its tolerance
  narrowed so that it still scales out once load per task passes target x 1.1 (the over-target
  line): what running hotter than the target saves in machine-hours and costs in over-target
  minutes, beside the oracles (the issue's S <= 0.85 H is below the oracle at the target).

Both autoscalers decide every 15 s, see load MEASURE_DELAY seconds old (what the tasks used: at
most one core each), and new tasks serve STARTUP seconds after they are asked for.

The srm's history is never the measured minutes. The built-in case: the measured week is a diurnal
week (trough at 05:00, peak at 20:00, weekends at 80 %), AR(1) noise, a flash crowd at 3x for 30
minutes (Thursday 11:00) and three metrics outages: 20 minutes on Friday's morning rise and 30 on
Tuesday's falling evening with no measurement reaching either autoscaler, 40 minutes on Wednesday's
falling evening with half the tasks not reporting; the history is the week before, another week:
10 % less load, each day's curve shifted by up to 40 minutes, its own noise, no flash crowd. Each
job's load is the trace at a scale of 0.5-1.5 and shifted by up to 3 hours, with noise of its own.
With --trace FILE: --history FILE is the history; without it the file's first week is, and the rest
is measured; a file of a week or less is measured with prediction off (said in the output).

Figures, for each policy: machine-hours (the machines the jobs' entitlements held); over-target
minutes (a minute whose load per serving task exceeded target x 1.1); starts+stops (tasks added,
removed and moved); churn above need (starts+stops minus the least churn that keeps
each job's load per task within target x (1 +- tolerance) minute by minute, from the true load: the
churn it takes to follow the load at all; need() says why not the variation of the smallest
sufficient size itself); scale-ins during outages (size reductions decided while
any task's measurement was missing).

    .venv/bin/python bench/bench_srm.py [--trace FILE [--history FILE]] [--jobs 10] [--machines 1000] [--days 7]
        [--aim 1.02,1.04,1.06]
    .venv/bin/python bench/make_trace.py bursty /tmp/bursty.csv && .venv/bin/python bench/bench_srm.py --trace /tmp/bursty.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import resource
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ca import SCAN_INTERVAL, ClusterAutoscaler  # noqa: E402
from controlplane.srm.forecast import EVERY as FORECAST_EVERY, refresh  # noqa: E402
from controlplane.srm.recommend import Memory, Reading, recommend, usage_reading  # noqa: E402
from controlplane.srm.victims import choose, frees  # noqa: E402
from controlplane.store.autoscale import Autoscale  # noqa: E402
from controlplane.store.records import TaskRec  # noqa: E402
from controlplane.usage.history import Series  # noqa: E402
from hpa import Hpa  # noqa: E402

STEP = 15.0  # seconds between decisions: HPA's sync period, the SRM's --srm-interval
MEASURE_DELAY = 30.0  # seconds between the load and its measurement reaching the autoscaler
STARTUP = 60.0  # seconds from a task asked for to a task serving
SLOTS = 4  # tasks (of 1 cpu) a machine holds
TARGET = 0.6
SAMPLE = 10.0  # the daemon's --usage-sample
STALE_AFTER = 2 * STEP + SAMPLE  # the daemon's: a reading older than this is no reading
WEEK = 7 * 24 * 60
T0 = 2 * WEEK * 60  # the measured week's start on the clock the history keeps (a Monday, 00:00)
POLICY = Autoscale(min=2, max=1000, target_cpu=TARGET, tolerance=0.1, predictive=True, scale_down_after=300,
                   max_changes_per_hour=6)


# -- the trace ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outage:
    start: int  # minutes from the measured trace's start
    end: int
    reporting: float  # the share of tasks whose measurements still arrive (0: none)


def builtin_trace(seed: int, flash: bool = True, level: float = 1.0, drift: float = 0.0) -> list[float]:
    """Cores a minute for a week (a job of about 40 cores at peak). `flash`: the flash crowd;
    `level`: the week's scale; `drift`: minutes by which each day's curve may be shifted (a day of
    its own: another week's)."""
    rng = random.Random(seed)
    shifts = [rng.uniform(-drift, drift) for _ in range(7)]
    out, noise = [], 0.0
    for m in range(WEEK):
        day = m // 1440
        hour = ((m - shifts[day]) / 60) % 24
        rise = 0.5 - 0.5 * math.cos(2 * math.pi * ((hour - 5) % 24) / 30) if (hour - 5) % 24 < 15 else \
            0.5 + 0.5 * math.cos(math.pi * ((hour - 20) % 24) / 9)
        load = level * 40 * (0.25 + 0.75 * rise) * (0.8 if day >= 5 else 1.0)
        noise = 0.9 * noise + rng.gauss(0, 0.03)
        out.append(load * (1 + noise))
    at = 3 * 1440 + 11 * 60
    for m in range(at, at + 30 if flash else at):
        out[m] *= 3
    return out


BUILTIN_OUTAGES = (
    Outage(4 * 1440 + 7 * 60, 4 * 1440 + 7 * 60 + 20, 0.0),  # Friday's morning rise: nothing arrives
    Outage(1 * 1440 + 20 * 60 + 30, 1 * 1440 + 21 * 60, 0.0),  # Tuesday's falling evening: nothing arrives
    Outage(2 * 1440 + 21 * 60, 2 * 1440 + 21 * 60 + 40, 0.5),  # Wednesday's falling evening: half report
)


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


def split(trace: list[float], name: str, history: list[float] | None = None,
          history_name: str | None = None) -> tuple[list[float], list[float] | None, str]:
    """(the minutes measured, the srm's history or None, the words saying which): the history is
    never the measured minutes. A history given: its last week. Else a trace longer than a week:
    its first week, and the rest measured. Else none (prediction off)."""
    if history is not None:
        return trace, history[-WEEK:], f"trace {name}, history {history_name}; no metrics outage"
    if len(trace) > WEEK:
        return (trace[WEEK:], trace[:WEEK], f"trace {name}: its first week the srm's history, the "
                f"{(len(trace) - WEEK) / 1440:.1f} days after it measured; no metrics outage")
    return trace, None, (f"trace {name}: one week or less, so no history: measured with prediction off "
                         f"(srm is srm-nopred); no metrics outage")


def need(load: list[float], minimum: int) -> int:
    """The least churn any policy could have while keeping each minute's load per task within the
    tolerance band around the target (target x 0.9 to target x 1.1: never over target, never
    holding more than the tolerance allows): the total variation of the laziest size that stays in
    the band, moved minute by minute only when the band leaves it, to the band's nearest edge (the
    least total variation of a sequence confined to intervals). Not the variation of the smallest
    sufficient size itself: noise alone moves that across a task boundary nearly every minute (on
    the built-in week 104,059 starts+stops, five times what any policy here made)."""
    size, total = None, 0
    for x in load:
        lo = max(minimum, math.ceil(x / (TARGET * (1 + POLICY.tolerance)) - 1e-9))
        hi = max(lo, math.floor(x / (TARGET * (1 - POLICY.tolerance)) + 1e-9))
        if size is None:
            size = lo
        new = min(max(size, lo), hi)
        total += abs(new - size)
        size = new
    return total


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

    def grow(self, n: int, now: float) -> int:
        """n tasks more, on the job's machines with room (the fullest first), then on machines
        taken from the pool. Returns the machines taken."""
        free = sorted((m for m, ts in self.machines.items() if len(ts) < SLOTS), key=lambda m: -len(self.machines[m]))
        index, took = 0, 0
        for _ in range(n):
            while index in self.tasks:
                index += 1
            if not free:
                m = self.pool.take()
                if m is None:
                    return took  # the pool is empty: the task is not placed
                took += 1
                self.machines[m] = set()
                free.append(m)
            m = free[0]
            self.machines[m].add(index)
            self.tasks[index] = (m, now + STARTUP)
            self.starts += 1
            if len(self.machines[m]) >= SLOTS:
                free.pop(0)
        return took

    def stop(self, indices) -> None:
        for i in indices:
            m, _ = self.tasks.pop(i)
            self.machines[m].discard(i)
            self.stops += 1
            if not self.machines[m]:
                del self.machines[m]
                self.pool.give()

    def drain(self, machine: str, now: float) -> None:
        """The machine's tasks evicted and started again on the job's other machines, best fit
        (the fullest with room); the machine goes back to the pool."""
        for i in sorted(self.machines.pop(machine)):
            dest = min((m for m, ts in self.machines.items() if len(ts) < SLOTS),
                       key=lambda m: (SLOTS - len(self.machines[m]), m))
            self.machines[dest].add(i)
            self.tasks[i] = (dest, now + STARTUP)
            self.stops += 1
            self.starts += 1
        self.pool.give()

    def records(self, now: float) -> tuple[dict, dict]:
        """The job's tasks as the daemon's records, and its entitlement's tasks on each machine."""
        recs = {i: TaskRec(self.name, i, 1, {}, m, "running" if at <= now else "starting")
                for i, (m, at) in self.tasks.items()}
        return recs, {m: len(ts) for m, ts in self.machines.items()}

    def srm_victims(self, k: int, now: float) -> list[int]:
        recs, on = self.records(now)
        return choose(recs, sorted(self.tasks), on, k)

    def replicaset_victims(self, k: int, now: float) -> list[int]:
        """A ReplicaSet's scale-down order: not ready first, then pods on the machines holding the
        most of its pods, then the newest."""
        def key(i: int) -> tuple:
            m, at = self.tasks[i]
            return (at <= now, -len(self.machines[m]), -at)
        return sorted(self.tasks, key=key)[:k]


# -- the run -----------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    machine_seconds: float = 0.0
    over: int = 0
    changes: int = 0  # starts + stops (a move is both)
    resizes: int = 0
    outage_scale_ins: int = 0
    need: int = 0  # the churn it takes to follow the load at all (the same for every policy)
    moves: int = 0

    @property
    def above_need(self) -> int:
        return self.changes - self.need


@dataclass
class Side:
    """One policy over every job: its pool, and each job's tasks and autoscaler state."""

    name: str
    kind: str  # "hpa" or "srm"
    ca: bool = False
    policy: Autoscale = POLICY
    result: Result = field(init=False)
    pool: Pool | None = None
    jobs: list = field(default_factory=list)
    cpu: float = 0.0
    calls: int = 0
    lead: float = 0.0  # seconds the SRM's forecast looks further ahead (a reclaim's notice: bench_capacity)
    aim: float = 1.0  # the SRM sizes tasks for load per task of target x aim (--aim: the rows srm@A)

    def __post_init__(self) -> None:
        self.result = Result(self.name)


def warm_history(load: list[float]) -> Series:
    """The job's usage history as the Recorder keeps it: `load`, the minutes before the measured
    trace's first (its last minute the one just before it)."""
    s = Series()
    base = T0 // 60 - len(load)
    for m, x in enumerate(load):
        s.put_minute(base + m, round(x * 1000), 64)
        if (base + m + 1) % 60 == 0:
            s.close_hour((base + m) // 60)
    return s


def static_result(name: str, loads: list[list[float]], minutes: int, size_of) -> Result:
    r = Result(name)
    for load in loads:
        n = max(POLICY.min, math.ceil(size_of(load[:minutes]) / TARGET - 1e-9))
        r.machine_seconds += math.ceil(n / SLOTS) * minutes * 60
        r.over += sum(1 for x in load[:minutes] if x / n > TARGET * 1.1)
    return r


def oracle(loads: list[list[float]], minutes: int, per_task: float, window: int = 0) -> float:
    """Machine-hours of a policy that knew each minute's load: every job at ceil(load / per_task)
    tasks each minute (no start-up time, no measurement delay), on as few machines as hold them.
    `window`: minutes a scale-in waits (the policy's scale_down_after): each minute's size is then
    the largest of that minute's and the `window` minutes' before it."""
    total = 0
    for load in loads:
        sizes = [max(POLICY.min, math.ceil(x / per_task - 1e-9)) for x in load[:minutes]]
        kept: list[int] = []  # indices of the window's sizes, its largest first (a monotonic deque)
        for m, n in enumerate(sizes):
            while kept and sizes[kept[-1]] <= n:
                kept.pop()
            kept.append(m)
            if kept[0] < m - window:
                kept.pop(0)
            total += math.ceil(sizes[kept[0]] / SLOTS)
    return total / 60


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def reporting_at(outages, minute: int, seen_minute: int) -> float:
    """The share of tasks whose measurement reaches the autoscalers now."""
    share = 1.0
    for o in outages:
        if o.start <= minute < o.end or o.start <= seen_minute < o.end:
            share = min(share, o.reporting)
    return share


def new_job(side: Side, j: int, load: list[float], history: list[list[float]] | None) -> dict:
    """Job j of a side at the trace's start: its tasks (sized for the first minute's load), and
    its autoscaler's state."""
    n0 = max(POLICY.min, math.ceil(load[0] / TARGET))
    sim = JobSim(side.pool, f"j{j}/api")
    sim.grow(n0, -STARTUP)
    sim.starts = 0
    job = {"load": load, "sim": sim, "ready": []}
    if side.kind == "hpa":
        job["auto"] = Hpa(POLICY.min, POLICY.max, TARGET)
        job["ca"] = ClusterAutoscaler(SLOTS) if side.ca else None
    else:
        job["mem"] = Memory()
        job["series"] = warm_history(history[j]) if history is not None else Series()
    return job


def decide(side: Side, job: dict, now: float, seen_minute: int, share: float) -> int:
    """The job's size its autoscaler asks for now: the HPA's (side.kind "hpa") or the SRM's as the
    daemon runs it, from the load seen MEASURE_DELAY late, of the serving tasks that report
    (`share`). Keeps what the step leaves behind: the serving count (job["ready"], for the
    minute's over-target test) and, for the SRM, its memory and usage series."""
    sim: JobSim = job["sim"]
    measured = job["load"][max(0, seen_minute)]
    ready = sim.serving(now)
    job["ready"].append(ready)
    size = sim.size()
    used = min(measured, ready * 1.0)  # what the serving tasks used (a core each at most)
    reporting = round(ready * share)
    if side.kind == "hpa":
        per_pod = used / ready if ready else None
        return job["auto"].desired(now, size, [per_pod] * reporting + [None] * (ready - reporting), size - ready)
    began = time.process_time()
    mem: Memory = job["mem"]
    clock = T0 + now  # the history's clock
    if side.policy.predictive:
        refresh(mem, job["series"], clock, mem.startup + STEP + SAMPLE + side.lead)
    summed = used * reporting / ready * 1000 if reporting else None
    r = usage_reading(summed, reporting, ready)
    reading = Reading(r.load, MEASURE_DELAY, ready) if r.load is not None else r
    asked = [0.0]

    def frees_now() -> list[int]:  # victims.frees, as the daemon asks it, on the task records the daemon
        t = time.process_time()  # keeps: building those is the simulator's CPU, not the recommender's
        recs, on = sim.records(now)
        asked[0] += time.process_time() - t
        return frees(recs, sorted(sim.tasks), on)

    d = recommend(side.policy, mem, clock, size, reading, TARGET * side.aim, TARGET * side.aim, None, STALE_AFTER,
                  frees_now)
    side.cpu += time.process_time() - began - asked[0]
    side.calls += 1
    mem.ran(clock, ready)
    if summed is not None:  # the Recorder keeps the tasks' usage sums
        job["series"].sample(clock, round(summed), 64)
    hour = int(clock // 3600)
    if hour != job.setdefault("hour", hour):  # and rolls each hour up once it is over
        job["series"].close_hour(job["hour"])
        job["hour"] = hour
    return d.size


def over_target_minute(side: Side, minute: int) -> None:
    """At a minute's end: count the jobs whose load per serving task (the minute's mean) was
    over target x 1.1."""
    for job in side.jobs:
        r = job["ready"]
        serving = sum(r) / len(r)
        if job["load"][minute] / max(serving, 1e-9) > TARGET * 1.1:
            side.result.over += 1
        r.clear()


def simulate(loads: list[list[float]], history: list[list[float]] | None, outages, machines: int, minutes: int,
             predictive: bool = True, aims: tuple[float, ...] = ()) -> tuple[list[Result], dict]:
    sides = [Side("hpa", "hpa"), Side("hpa+ca", "hpa", ca=True),
             Side("srm", "srm", policy=replace(POLICY, predictive=predictive)),
             Side("srm-nopred", "srm", policy=replace(POLICY, predictive=False))]
    # --aim: the srm sizing for target x A a task, its tolerance narrowed so that it still scales out
    # once load per task passes target x (1 + tolerance), the over-target line
    sides += [Side(f"srm@{a:g}", "srm", policy=replace(POLICY, predictive=predictive,
                                                      tolerance=round((1 + POLICY.tolerance) / a - 1, 6)), aim=a)
              for a in aims]
    needed = sum(need(load[:minutes], POLICY.min) for load in loads)
    for side in sides:
        side.pool = Pool(machines)
        side.result.need = needed
        side.jobs = [new_job(side, j, load, history) for j, load in enumerate(loads)]
    steps_per_minute = int(60 // STEP)
    for step in range(int(minutes * 60 // STEP)):
        now = step * STEP
        minute = int(now // 60)
        seen_minute = int((now - MEASURE_DELAY) // 60)
        share = reporting_at(outages, minute, seen_minute)
        for side in sides:
            res = side.result
            for job in side.jobs:
                sim: JobSim = job["sim"]
                size = sim.size()
                new = decide(side, job, now, seen_minute, share)
                if new > size:
                    if sim.grow(new - size, now) and job.get("ca") is not None:
                        job["ca"].grew(now)
                elif new < size:
                    victims = sim.srm_victims(size - new, now) if side.kind == "srm" else \
                        sim.replicaset_victims(size - new, now)
                    sim.stop(victims)
                    if share < 1.0:
                        res.outage_scale_ins += 1
                if new != size:
                    res.resizes += 1
                    if side.kind == "srm":
                        job["mem"].changed(T0 + now, size, sim.size())
                ca = job.get("ca")
                if ca is not None:  # its scans (every SCAN_INTERVAL) that fall within this step
                    t = max(now, ca.last_scan + SCAN_INTERVAL)
                    while t < now + STEP:
                        victim = ca.scan(t, {m: len(ts) for m, ts in sim.machines.items()})
                        if victim is not None:
                            res.moves += len(sim.machines[victim])
                            sim.drain(victim, t)
                        t += SCAN_INTERVAL
            res.machine_seconds += side.pool.held * STEP
        if (step + 1) % steps_per_minute == 0:
            for side in sides:
                over_target_minute(side, minute)
    for side in sides:
        side.result.changes = sum(job["sim"].starts + job["sim"].stops for job in side.jobs)
    srm = next(s for s in sides if s.name == "srm")
    return [s.result for s in sides], {"srm_cpu": srm.cpu, "srm_calls": srm.calls,
                                       "unplaced": {s.name: s.pool.refused for s in sides}}


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
    p.add_argument("--history", help="CSV of seconds,load: the srm's history (its last week), the week before --trace")
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--machines", type=int, default=1000)
    p.add_argument("--days", type=float, default=7.0, help="of the measured trace (default a week)")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--aim", default="", help="comma-separated A > 1: a row more each, the srm sizing tasks for "
                   "load per task of target x A (its tolerance narrowed to scale out at target x 1.1 still): what "
                   "running hotter than the target gives in machine-hours and costs in over-target minutes")
    p.add_argument("--daemon-jobs", type=int, default=20_000,
                   help="autoscaled jobs (of 10 tasks) the daemon's own per-job pass is measured on (0: not)")
    args = p.parse_args()
    if args.history and not args.trace:
        p.error("--history goes with --trace (the built-in week has its own)")
    predictive = True
    if args.trace:
        base, before, where = split(read_trace(args.trace), args.trace,
                                    read_trace(args.history) if args.history else None, args.history)
        predictive, outages = before is not None, ()
    else:
        base, outages = builtin_trace(args.seed), BUILTIN_OUTAGES
        before = builtin_trace(args.seed + 1, flash=False, level=0.9, drift=40)
        where = ("the built-in diurnal week (flash crowd 3x for 30 min; metrics outages: none arriving 20 min "
                 "on a rise and 30 min on a fall, half the tasks 40 min on a fall); the srm's history: the week "
                 "before, 10 % less load, days shifted up to 40 min, other noise, no flash crowd")
    minutes = min(len(base), int(args.days * 1440))
    began = time.perf_counter()
    loads = job_loads(base, args.jobs, args.seed, args.seed)
    history = job_loads(before, args.jobs, args.seed, args.seed + 2) if before is not None else None
    try:
        aims = tuple(float(a) for a in args.aim.split(",") if a.strip())
    except ValueError:
        p.error(f"--aim {args.aim!r}: comma-separated numbers")
    if any(not 1 < a < 1 + POLICY.tolerance for a in aims):
        p.error(f"--aim {args.aim!r}: each between 1 and {1 + POLICY.tolerance:g} (the over-target line)")
    results, cost = simulate(loads, history, outages, args.machines, minutes, predictive, aims)
    static = static_result("static", loads, minutes, p99)
    peak = static_result("static-peak", loads, minutes, max)
    by = {r.name: r for r in (static, peak, *results)}
    wall = time.perf_counter() - began
    hours = minutes / 60
    print(f"{where}: {args.jobs} job(s), {args.machines} machines of {SLOTS} task slots, {hours:.0f} h measured "
          f"in steps of {STEP:g} s; target {TARGET} a task; load seen {MEASURE_DELAY:g} s late; tasks serve "
          f"{STARTUP:g} s after they are asked for; srm policy {POLICY.to_json()}")
    print(f"{'policy':12} {'machine-hours':>13} {'vs hpa+ca':>10} {'over-target min':>16} {'starts+stops':>13} "
          f"{'above need':>11} {'moves':>6} {'resizes':>8} {'outage scale-ins':>17}")
    ca = by["hpa+ca"]
    for r in by.values():
        dynamic = r.name not in ("static", "static-peak")
        print(f"{r.name:12} {r.machine_seconds / 3600:13.0f} {r.machine_seconds / ca.machine_seconds:9.2f}x "
              f"{r.over:16d} {r.changes:13d} {r.above_need if dynamic else '':>11} {r.moves if dynamic else '':>6} "
              f"{r.resizes if dynamic else '':>8} {r.outage_scale_ins if dynamic else '':>17}")
    at, edge = oracle(loads, minutes, TARGET), oracle(loads, minutes, TARGET * (1 + POLICY.tolerance))
    wait = round(POLICY.scale_down_after / 60)
    held = oracle(loads, minutes, TARGET, wait)
    print(f"a policy that knew the load (each minute's size from it, no start-up, machines packed full): "
          f"{at:.0f} machine-hours at the target ({at * 3600 / ca.machine_seconds:.2f}x hpa+ca), {edge:.0f} at "
          f"target x {1 + POLICY.tolerance:g}, the edge of over-target ({edge * 3600 / ca.machine_seconds:.2f}x); "
          f"at the target with the policy's scale_down_after (each minute at the largest size of its last "
          f"{wait + 1} minutes): {held:.0f} ({held * 3600 / ca.machine_seconds:.2f}x)")
    print(f"churn the load asks for (need: the least that keeps load per task within target x (1 +- "
          f"{POLICY.tolerance:g}) every minute): {ca.need}")
    if any(cost["unplaced"].values()):
        print(f"the free pool ran out: tasks not placed {cost['unplaced']} (give more --machines)")
    per = cost["srm_cpu"] / max(cost["srm_calls"], 1)
    print(f"srm recommender: {per * 1e6:.1f} us of CPU per job per interval (forecast, recommend() and "
          f"victims.frees() when a scale-in is weighed, "
          f"{cost['srm_calls']} calls); 100,000 autoscaled jobs every {STEP:g} s would take "
          f"{100 * per * 100_000 / STEP:.1f}% of one core")
    if args.daemon_jobs:
        per_job = daemon_pass(args.daemon_jobs)
        print(f"the daemon's pass (Autoscaler.decide, measured on {args.daemon_jobs} jobs of 10 tasks): "
              f"{per_job * 1e6:.1f} us of CPU per job per interval; 100,000 jobs every {STEP:g} s would take "
              f"{100 * per_job * 100_000 / STEP:.1f}% of one core")
    print(f"simulated in {wall:.0f} s of wall time; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    srm = by["srm"]
    goals = [("S <= 0.85 H", srm.machine_seconds <= 0.85 * ca.machine_seconds),
             ("A <= B / 2", srm.over <= ca.over / 2), ("C <= D / 2", srm.above_need <= ca.above_need / 2),
             ("E = 0", srm.outage_scale_ins == 0)]
    print(f"issue #36's goals ({'set for the built-in week, here on this trace' if args.trace else 'the built-in week'}): "
          + "; ".join(f"{g} {'met' if ok else 'NOT MET'}" for g, ok in goals))
    print(f"srm: machine-hours {srm.machine_seconds / 3600:.0f} (hpa+ca {ca.machine_seconds / 3600:.0f}, static "
          f"{static.machine_seconds / 3600:.0f}); over-target minutes {srm.over} (hpa+ca {ca.over}); churn above need "
          f"{srm.above_need} (hpa+ca {ca.above_need}); scale-ins during outages {srm.outage_scale_ins} "
          f"(hpa+ca {ca.outage_scale_ins})")


if __name__ == "__main__":
    main()
