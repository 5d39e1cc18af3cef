"""This replica's current usage: the last report of each machine whose heartbeats reach it, and
their sums per job and per fleet cell (dc, msb, entitlement, host profile, machine type), kept
as each report comes (a report replaces the machine's last: its old figures are taken out of the
sums, its new ones put in). Figures are integers (millicores, MiB, milliwatts), so that sums
taken out and put in a million times stay exact. A machine not heard from for `stale` seconds
is taken out (`sweep`): its health owner moved, or it went silent.

Each task's own last figures are kept too, in its machine's report, with the machines each job's
tasks are on (issue #35: a job's answer lists them, and the ReBalancer weighs a machine by its
own tasks); they stay with this replica, never in the sums it relays (usage/peers.py asks the
other replicas for them when they are wanted). A task an agent lists twice is answered twice:
the askers key them by job, index and machine."""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
import time
from array import array
from typing import AsyncIterator, Collection, Container, Generator, Iterator, NamedTuple, Sequence, TypeVar

T = TypeVar("T")
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


def share(window: float) -> float:
    """How far a figure measured over `window` seconds moves the exponential mean: this share of
    the way from the mean to the figure."""
    return -math.expm1(-window / SMOOTHING)


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
    # each known job on it once, in the order the report first names them (one string a job, the
    # region view's), and what its tasks there use together: SUMS figures a job (millicores, MiB,
    # tasks) in one array. Each task's own figures, FIELDS of them a task in one array of unsigned
    # 32-bit integers, its job by its place in `jobs`. A replica holds every task's last figures
    # and takes 20 or so of them in each heartbeat (issue #38): a NamedTuple a task and a key of its
    # job's map held 7,928 bytes a machine of 20 tasks; a string a task and 64-bit figures, with a
    # tuple a job for its sums and a cell tuple a machine, 2,254; packed so, 1,345
    # (bench_usage_book.py). TaskUsage is made of them only when asked for (tasks())
    jobs: tuple[str, ...] = ()
    sums: array = array("q")
    figures: array = array("I")
    wall: float = 0.0  # the wall clock when it came (TaskUsage.at)

    def each(self) -> Iterator[tuple[str, int, int, int, int]]:
        """(job, index, millicores, MiB, smoothed millicores) of each task held."""
        f = self.figures
        return zip(map(self.jobs.__getitem__, f[JOB::FIELDS]), f[INDEX::FIELDS], f[CPU::FIELDS], f[MEM::FIELDS],
                   f[AVG::FIELDS])

    def per_job(self) -> Iterator[tuple[str, int, int, int]]:
        """(job, millicores, MiB, tasks) of each job on it."""
        s = self.sums
        return zip(self.jobs, s[0::SUMS], s[1::SUMS], s[2::SUMS])

    def count(self) -> int:
        """How many tasks it holds figures of."""
        return len(self.figures) // FIELDS


JOB, INDEX, CPU, MEM, AVG = range(5)  # a task's figures, in Held.figures (JOB: its job's place in Held.jobs)
FIELDS = 5
SUMS = 3
STEP_TASKS = 20_000  # tasks an ask makes between two pauses (tasks_stepwise): 6-8 ms here (bench_usage_book)


async def in_slices(items: Sequence[T], step: int = STEP_TASKS) -> AsyncIterator[Sequence[T]]:
    """`items`, `step` at a time, the event loop let run between two slices: how the askers of many
    tasks' figures go over them (a peer's answer, the merge, the ReBalancer's figures)."""
    for at in range(0, len(items), step):
        if at:
            await asyncio.sleep(0)
        yield items[at:at + step]


class UsageBook:
    def __init__(self, stale: float = 10.0):
        self.stale = stale
        self.machines: dict[str, Held] = {}
        self.jobs: dict[str, list[int]] = {}  # handle -> [millicores, MiB, tasks reporting]
        # handle -> the machines whose last report has tasks of it (a dict for its order); changed
        # only when a machine's jobs do, not with each task's figures
        self.by_job: dict[str, dict[str, None]] = {}
        # cell -> [tasks' millicores, tasks' MiB, hosts' millicores, hosts' MiB, milliwatts, machines
        # reporting, machines reporting power]
        self.cells: dict[Cell, list[int]] = {}
        # each cell's one tuple, held by every machine of it (a heartbeat's is made anew: 96 bytes a
        # machine held); one a cell the region has had since the process started (an entitlement,
        # profile or MSB gone leaves its few tuples here)
        self._cell_of: dict[Cell, Cell] = {}
        self._latest = -math.inf  # the latest `now` a report came at
        self._in_order = True  # every report came at a `now` no earlier than the one before (sweep)

    def note(self, mid: str, cell: Cell, usage: dict, known: Container[str], now: float,
             wall: float | None = None) -> None:
        """A heartbeat's usage (checked: agent/models.py Usage and usage_beyond), come at `now`
        (monotonic; `wall`: the wall clock). Tasks of jobs not in `known` (the region's) are left
        out: an agent names no job into the sums."""
        power = usage.get("power_w")
        wall = time.time() if wall is None else wall
        cell = self._cell_of.setdefault(cell, cell)
        # a machine's tasks of one job, summed first (one entry in the sums): job -> [cores, MiB,
        # tasks, its place in Held.jobs]
        per_job: dict[str, list] = {}
        figures: list[int] = []
        old = self.machines.get(mid)
        prev_jobs, prev = (old.jobs, old.figures) if old is not None else ((), ())
        held_before = len(prev) // FIELDS
        last: dict | None = None  # (job, index) -> its smoothed figure, made only when the order changed
        moved = share(usage["window"])
        at = 0  # this task's place among those kept, and of its figures (at * FIELDS)
        for job, index, cpu, mem in usage.get("tasks") or ():
            if job in known:
                cpu_m = round(cpu * 1000)
                # an agent lists its tasks in the same order report after report: the one at this place
                # in the last report first
                if at < held_before and prev[at * FIELDS + INDEX] == index and \
                        prev_jobs[prev[at * FIELDS + JOB]] == job:
                    job, before = prev_jobs[prev[at * FIELDS + JOB]], prev[at * FIELDS + AVG]  # its string as held
                else:
                    # one string a job, the region view's (interned there), not one a task a report: a
                    # replica holds every task's last figures (issue #38)
                    job = sys.intern(job)
                    if last is None:
                        last = {(prev_jobs[prev[i * FIELDS + JOB]], prev[i * FIELDS + INDEX]): prev[i * FIELDS + AVG]
                                for i in range(held_before)}
                    before = last.get((job, index))
                at += 1
                s = per_job.get(job)
                if s is None:
                    s = per_job[job] = [cpu, mem, 1, len(per_job)]
                else:
                    s[0] += cpu
                    s[1] += mem
                    s[2] += 1
                figures += (s[3], index, cpu_m, round(mem),
                            cpu_m if before is None else round(before + (cpu_m - before) * moved))
        sums = array("q", [v for c, m, n, _ in per_job.values() for v in (round(c * 1000), round(m), n)])
        held = Held(now, cell, round(usage["cpu"] * 1000), round(usage["memory_mb"]),
                    None if power is None else round(power * 1000), tuple(per_job), sums, array("I", figures), wall)
        if old is not None:
            self._add(mid, old, -1)
            del self.machines[mid]  # to the end: the book in the order its reports came (sweep)
        if now < self._latest:
            self._in_order = False  # a report older than one held (never, with the monotonic clock)
        self._latest = max(self._latest, now)
        self.machines[mid] = held
        self._add(mid, held, 1)

    def drop(self, mid: str) -> None:
        held = self.machines.pop(mid, None)
        if held is not None:
            self._add(mid, held, -1)

    def sweep(self, now: float) -> int:
        """Take out the machines not heard from for `stale` seconds; how many. The book holds its
        machines in the order their last reports came, so the stale ones are its first: it looks at
        those and the next, not at every machine (issue #38: a pass over the 25,000 machines a
        replica held, every second, was 7 ms of its loop a second at 1M, and grew with them)."""
        if self._in_order:
            gone = []
            for mid, h in self.machines.items():
                if now - h.at <= self.stale:
                    break
                gone.append(mid)
        else:  # reports came out of order: every machine looked at
            gone = [mid for mid, h in self.machines.items() if now - h.at > self.stale]
        for mid in gone:
            self.drop(mid)
        return len(gone)

    def tasks(self, jobs: Collection[str] | None = None, entitlements: Collection[str] | None = None
              ) -> list[TaskUsage]:
        """The figures of each task of `jobs` and of the jobs of `entitlements`; of every job when
        neither is given. At once: an ask of many tasks on the event loop takes tasks_stepwise."""
        steps = self.tasks_stepwise(jobs, entitlements)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def tasks_stepwise(self, jobs: Collection[str] | None = None, entitlements: Collection[str] | None = None,
                       step: int = STEP_TASKS) -> Generator[None, None, list[TaskUsage]]:
        """tasks(), pausing (a bare yield) after each `step` tasks made or so, its list the
        generator's value: every job's tasks, half a million in bench_usage_book, took 370 ms in
        one go, about 10 a ReBalancer round's ask at 1M machines' scale (issue #38). The book may
        change at a pause: a machine's report is read as it is when its turn comes, and a machine
        let go meanwhile is left out."""
        if entitlements is None and jobs is not None:  # a few jobs: no pass over every job's
            wanted = set(jobs)
        else:
            wanted = {h for h in self.by_job if chosen(h, jobs, entitlements)}
        out: dict[str, list[TaskUsage]] = {h: [] for h in sorted(wanted)}  # by job, in order
        on = list({mid: None for h in out for mid in self.by_job.get(h, ())})  # each machine once
        made = tuple.__new__  # TaskUsage._make's own way, without its call in Python (millions at 1M machines)
        machines, pause = self.machines, step
        for mid in on:
            held = machines.get(mid)
            if held is None:
                continue  # let go at a pause
            wall = held.wall
            for job, index, cpu, mem, avg in held.each():
                if (mine := out.get(job)) is not None:
                    mine.append(made(TaskUsage, (job, index, mid, cpu, mem, wall, avg)))
            pause -= held.count()
            if pause <= 0:
                yield
                pause = step
        return list(itertools.chain.from_iterable(out.values()))

    def _add(self, mid: str, h: Held, sign: int) -> None:
        cpu = mem = 0
        jobs, by_job = self.jobs, self.by_job
        for job, c, m, n in h.per_job():
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
            if sign > 0:
                by_job.setdefault(job, {})[mid] = None
            elif (mine := by_job.get(job)) is not None:
                mine.pop(mid, None)
                if not mine:
                    del by_job[job]
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
