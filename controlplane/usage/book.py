"""This replica's current usage: the last report of each machine whose heartbeats reach it, and
their sums per job and per fleet cell (dc, msb, entitlement, host profile, machine type), kept
as each report comes (a report replaces the machine's last: its old figures are taken out of the
sums, its new ones put in). Figures are integers (millicores, MiB, milliwatts), so that sums
taken out and put in a million times stay exact. A machine not heard from for `stale` seconds
is taken out (`sweep`): its health owner moved, or it went silent.

Each task's own last figures are kept too, by job (issue #35: a job's answer lists them, and the
ReBalancer weighs a machine by its own tasks); they stay with this replica, never in the sums it
relays (usage/peers.py asks the other replicas for them when they are wanted)."""

from __future__ import annotations

import math
import sys
import time
from typing import Collection, Container, NamedTuple

Cell = tuple[str, str, str, str, str]  # dc, msb, entitlement ("": the free pool), profile ("": none), machine type
# seconds over which a task's cpu is smoothed for the ReBalancer (cpu_avg_m): a heartbeat's own figure
# is its window's (a second or so), and on a busy host a burning task's went from above a machine's
# hot line in one plan to under it in the apply a second later
SMOOTHING = 30.0


class TaskUsage(NamedTuple):
    """One task's figures as its machine's agent last reported them."""

    job: str
    index: int
    machine: str
    cpu_m: int  # millicores
    memory_mb: int  # MiB
    at: float  # wall clock: when the report came
    # millicores smoothed over the task's reports on this machine (an exponential mean, SMOOTHING
    # seconds): what the ReBalancer weighs a machine by. Its first report's figure at first.
    cpu_avg_m: int


def smoothed(before: int, now: int, window: float) -> int:
    """The exponential mean moved by a figure measured over `window` seconds."""
    return round(before + (now - before) * -math.expm1(-window / SMOOTHING))


def chosen(job: str, jobs: Collection[str] | None, entitlements: Collection[str] | None) -> bool:
    """Whether a task of `job` is among those asked for: of `jobs`, of the jobs of `entitlements`,
    or of every job when neither is given (a job's handle begins with its entitlement)."""
    if jobs is None and entitlements is None:
        return True
    return job in (jobs or ()) or job.partition("/")[0] in (entitlements or ())


class Held(NamedTuple):
    """One machine's last report, as its figures went into the sums."""

    at: float  # monotonic time it came
    cell: Cell
    cpu_m: int  # the host's millicores in use
    memory_mb: int  # the host's MiB in use
    power_mw: int | None  # None: not measured
    tasks: tuple[tuple[str, int, int, int], ...]  # (job, millicores, MiB, tasks) of each known job on it
    each: tuple[TaskUsage, ...] = ()  # each task of a known job on it


class UsageBook:
    def __init__(self, stale: float = 10.0):
        self.stale = stale
        self.machines: dict[str, Held] = {}
        self.jobs: dict[str, list[int]] = {}  # handle -> [millicores, MiB, tasks reporting]
        self.by_job: dict[str, dict[tuple[int, str], TaskUsage]] = {}  # handle -> (index, machine) -> its figures
        # cell -> [tasks' millicores, tasks' MiB, hosts' millicores, hosts' MiB, milliwatts, machines
        # reporting, machines reporting power]
        self.cells: dict[Cell, list[int]] = {}

    def note(self, mid: str, cell: Cell, usage: dict, known: Container[str], now: float,
             wall: float | None = None) -> None:
        """A heartbeat's usage (checked: agent/models.py Usage and usage_beyond), come at `now`
        (monotonic; `wall`: the wall clock). Tasks of jobs not in `known` (the region's) are left
        out: an agent names no job into the sums."""
        power = usage.get("power_w")
        wall = time.time() if wall is None else wall
        per_job: dict[str, list] = {}  # a machine's tasks of one job, summed first: one entry in the sums
        each = []
        old = self.machines.get(mid)
        prev = old.each if old is not None else ()
        last: dict | None = None  # (job, index) -> its smoothed figure, made only when the order changed
        window = usage["window"]
        for job, index, cpu, mem in usage.get("tasks") or ():
            if job in known:
                # one string a job, the region view's (interned there), not one a task a report: a
                # replica holds every task's last figures (issue #38)
                job = sys.intern(job)
                cpu_m = round(cpu * 1000)
                # an agent lists its tasks in the same order report after report: the one at this place
                # in the last report first
                p = prev[len(each)] if len(each) < len(prev) else None
                if p is not None and p.index == index and p.job == job:
                    before = p.cpu_avg_m
                else:
                    if last is None:
                        last = {(t.job, t.index): t.cpu_avg_m for t in prev}
                    before = last.get((job, index))
                each.append(TaskUsage(job, index, mid, cpu_m, round(mem), wall,
                                      cpu_m if before is None else smoothed(before, cpu_m, window)))
                s = per_job.get(job)
                if s is None:
                    per_job[job] = [cpu, mem, 1]
                else:
                    s[0] += cpu
                    s[1] += mem
                    s[2] += 1
        tasks = tuple((job, round(c * 1000), round(m), n) for job, (c, m, n) in per_job.items())
        held = Held(now, cell, round(usage["cpu"] * 1000), round(usage["memory_mb"]),
                    None if power is None else round(power * 1000), tasks, tuple(each))
        self.drop(mid)
        self.machines[mid] = held
        self._add(held, 1)

    def drop(self, mid: str) -> None:
        held = self.machines.pop(mid, None)
        if held is not None:
            self._add(held, -1)

    def sweep(self, now: float) -> int:
        """Take out the machines not heard from for `stale` seconds; how many."""
        gone = [mid for mid, h in self.machines.items() if now - h.at > self.stale]
        for mid in gone:
            self.drop(mid)
        return len(gone)

    def tasks(self, jobs: Collection[str] | None = None, entitlements: Collection[str] | None = None
              ) -> list[TaskUsage]:
        """The figures of each task of `jobs` and of the jobs of `entitlements`; of every job when
        neither is given."""
        if entitlements is None and jobs is not None:  # a few jobs: no pass over every job's
            return [t for h in sorted(set(jobs)) for t in self.by_job.get(h, {}).values()]
        return [t for h in sorted(self.by_job) if chosen(h, jobs, entitlements) for t in self.by_job[h].values()]

    def _add(self, h: Held, sign: int) -> None:
        by_job = self.by_job
        for t in h.each:
            if sign > 0:
                by_job.setdefault(t.job, {})[(t.index, t.machine)] = t
            elif (mine := by_job.get(t.job)) is not None:
                mine.pop((t.index, t.machine), None)
                if not mine:
                    del by_job[t.job]
        cpu = mem = 0
        jobs = self.jobs
        for job, c, m, n in h.tasks:
            s = jobs.get(job)
            if s is None:
                s = jobs[job] = [0, 0, 0]
            s[0] += sign * c
            s[1] += sign * m
            s[2] += sign * n
            if s[2] == 0:
                del jobs[job]
            cpu += c
            mem += m
        cs = self.cells.get(h.cell)
        if cs is None:
            cs = self.cells[h.cell] = [0, 0, 0, 0, 0, 0, 0]
        measured = h.power_mw is not None
        for i, v in enumerate((cpu, mem, h.cpu_m, h.memory_mb, h.power_mw or 0, 1, int(measured))):
            cs[i] += sign * v
        if cs[5] == 0:
            del self.cells[h.cell]


def cell_of(m) -> Cell:
    """A machine record's fleet cell (store/records.py MachineRec)."""
    lb = m.labels
    return (lb.get("dc", ""), lb.get("msb", ""), m.entitlement or "", m.profile_applied or "", lb.get("machine_type", ""))
