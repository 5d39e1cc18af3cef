"""This replica's current usage: the last report of each machine whose heartbeats reach it, and
their sums per job and per fleet cell (dc, msb, entitlement, host profile, machine type), kept
as each report comes (a report replaces the machine's last: its old figures are taken out of the
sums, its new ones put in). Figures are integers (millicores, MiB, milliwatts), so that sums
taken out and put in a million times stay exact. A machine not heard from for `stale` seconds
is taken out (`sweep`): its health owner moved, or it went silent."""

from __future__ import annotations

from typing import Container, NamedTuple

Cell = tuple[str, str, str, str, str]  # dc, msb, entitlement ("": the free pool), profile ("": none), machine type


class Held(NamedTuple):
    """One machine's last report, as its figures went into the sums."""

    at: float  # monotonic time it came
    cell: Cell
    cpu_m: int  # the host's millicores in use
    memory_mb: int  # the host's MiB in use
    power_mw: int | None  # None: not measured
    tasks: tuple[tuple[str, int, int, int], ...]  # (job, millicores, MiB, tasks) of each known job on it


class UsageBook:
    def __init__(self, stale: float = 10.0):
        self.stale = stale
        self.machines: dict[str, Held] = {}
        self.jobs: dict[str, list[int]] = {}  # handle -> [millicores, MiB, tasks reporting]
        # cell -> [tasks' millicores, tasks' MiB, hosts' millicores, hosts' MiB, milliwatts, machines
        # reporting, machines reporting power]
        self.cells: dict[Cell, list[int]] = {}

    def note(self, mid: str, cell: Cell, usage: dict, known: Container[str], now: float) -> None:
        """A heartbeat's usage (checked: agent/models.py Usage and usage_beyond). Tasks of jobs not
        in `known` (the region's) are left out: an agent names no job into the sums."""
        power = usage.get("power_w")
        per_job: dict[str, list] = {}  # a machine's tasks of one job, summed first: one entry in the sums
        for job, _, cpu, mem in usage.get("tasks") or ():
            if job in known:
                s = per_job.get(job)
                if s is None:
                    per_job[job] = [cpu, mem, 1]
                else:
                    s[0] += cpu
                    s[1] += mem
                    s[2] += 1
        tasks = tuple((job, round(c * 1000), round(m), n) for job, (c, m, n) in per_job.items())
        held = Held(now, cell, round(usage["cpu"] * 1000), round(usage["memory_mb"]),
                    None if power is None else round(power * 1000), tasks)
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

    def _add(self, h: Held, sign: int) -> None:
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
