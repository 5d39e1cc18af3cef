"""The ReBalancer against what Kubernetes users run to free machines, on a region after churn
(issues #27, #36).

A simulated region (no daemon, no containers; the fake parts are the history and the usage, named
so): M machines of 16 cores and 64 GiB, in MSBs of 500 machines (two dcs, MSBs alternating) and
racks of 25, and one entitlement per 500 machines. Every placement is our allocator's
(controlplane/allocator: allocate() on its Snapshot, as the daemon's scheduler calls it), and a
machine left with nothing goes back to the free pool, as the product does. The seeded history:
jobs are created until 65 % of the region's cores are reserved; then, in events, autoscaling
shrinks (the SRM's choice of victims, controlplane/srm/victims.py: the tasks on the machines
holding the fewest of the entitlement's tasks), resizes by hand (the highest indices
go), growth, stops, new jobs, and machine failures (the tasks placed elsewhere; the machine comes
back empty, to the free pool). Measured usage: each job uses a share of what it reserves
(lognormal), its tasks unevenly (a shard's load falls with its index, Zipf-like), each at most
what it reserves.

On that same state, one round each:
- ca scale-down: the Cluster Autoscaler's scale-down rule (bench/ca.py, tested in
  tests/bench/test_ca.py; here one still round, so without its timers): a machine whose tasks
  request under half its cpu and memory is drained when each of its tasks fits, best fit by
  requests, on the entitlement's other machines of the same MSB; the same per-job budget as ours;
  the least requested first, repeated until nothing changes;
- entitlement-wide: the same rule over the entitlement's machines of the dc, any MSB (what a
  Kubernetes user gets: more machines freed, the spread over MSBs broken);
- highnodeutilization: the descheduler's HighNodeUtilization (bench/descheduler.py, tested in
  tests/bench/test_descheduler.py; 20 %, PER_NODE a node) on each entitlement's machines, the
  evicted tasks placed as a scheduler scoring MostAllocated places them (the fullest machine of
  the entitlement in their dc that holds them);
- (for reference, issue #27's) the descheduler's LowNodeUtilization (thresholds 20 %, targets 50 %)
  then RemoveDuplicates, each evicted task placed again by our allocator;
- ours: controlplane.rebalancer.plan.plan() as GET /v1/rebalance/plan runs it: repair, hotspots
  (MSBs above the mean by more than 5 %, machines above 80 % measured), compaction per
  (entitlement, MSB) with CP-SAT, swaps with the free pool (whole free racks; every entitlement
  has a host profile, so each swap costs a profile switch), churn budget 25 % of a job a round;
  its moves applied;
- ours within the ca scale-down's moves: the same plan() with a move budget (GET
  /v1/rebalance/plan?max_moves=N, N the moves the ca scale-down made in this run) and the issue's
  hottest-MSB line (1.10) as its margin: the machines cheapest to free across every group
  (rebalancer/cheapest.py; out of a hot MSB into a cooler one of the dc first, so that the drain
  cools it; elsewhere within the MSB, another of the dc where nothing fits there), keeping back the
  moves the cooling still needs, then hotspots, then the cheapest machines again, then repair. This
  answers the issue's question as asked:
  what ours frees with no more moves than the autoscaler's. Its figures are the last line's.
The three baselines and ours run on the same board (controlplane/rebalancer/board.py) from the same
state, and the plan checker (score.py: scores() and violations()) judges every side's result.

Freed: machines holding tasks before the round less those holding tasks after (net: a swap gives
one machine back to the free pool and takes another; the baseline's allocator may take free ones
too). Moves:
tasks placed elsewhere (the baseline's evictions, ours planned moves). Hottest MSB: the MSB whose
measured cpu over its machines' cores is the highest, over the region's mean. Violations (ours):
the planner's own checks (score.py) and, recomputed here on the allocator's snapshot with the
moves applied, machines reserving more than they have and moves out of a task's dc or
entitlement. Solve: the wall time of plan() (the board, every goal, every group's solve), one
process, this machine; the round's view is built by the benchmark from the allocator's snapshot,
outside that time (the daemon builds it from its records). Before the goals, a line gives a lower
bound on the moves that free the machines the goal asks for within their MSBs (least_moves()).

Its last line: `rebalancer: freed F machines (ca scale-down G, entitlement-wide G2, highnodeutilization
G3) with M moves (ca scale-down N); spread excess X (ca scale-down Y); hottest MSB x1.XX of mean;
violations V (baselines W); solve T s`, F, M, X, the hottest MSB, V and T of the round within the
ca scale-down's moves (the line before it, of the round without a budget).

    .venv/bin/python bench/bench_rebalancer.py [--machines 10000] [--seed 27]
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controlplane.allocator.allocate import allocate  # noqa: E402
from controlplane.allocator.errors import AllocationError  # noqa: E402
from controlplane.allocator.model import Entitlement, JobRequest, Machine, PlacedTask  # noqa: E402
from controlplane.allocator.snapshot import Snapshot  # noqa: E402
from controlplane.rebalancer import view  # noqa: E402
from controlplane.rebalancer.board import Board  # noqa: E402
from controlplane.rebalancer.cheapest import CoolingLeft  # noqa: E402
from controlplane.rebalancer.compaction import _spare  # noqa: E402
from controlplane.rebalancer.plan import plan  # noqa: E402
from controlplane.rebalancer.score import Before, Scores, scores, violations  # noqa: E402
from controlplane.srm.victims import choose  # noqa: E402
from controlplane.store.records import TaskRec  # noqa: E402
from ca import Node as CaNode, unneeded  # noqa: E402
from descheduler import Node, Pod, high_node_utilization, low_node_utilization, remove_duplicates  # noqa: E402

CORES, MEMORY = 16, 65536
MSB_SIZE, RACK_SIZE, ENT_SIZE = 500, 25, 500
FILL = 0.65  # of the region's cores reserved before the churn
PER_NODE = 5  # the descheduler's maxNoOfPodsToEvictPerNode
HOTTEST = 1.10  # issue #36's line for the hottest MSB over the region's mean
SIZES = ((0.5, 30), (1.0, 30), (2.0, 25), (4.0, 15))  # task cores, weight


@dataclass
class Job:
    name: str
    cpus: float
    memory_mb: int
    top: int  # tasks 0..top-1 but gaps
    gaps: set[int] = field(default_factory=set)
    share: float = 0.3  # of what it reserves, the job uses

    def request(self, replace_: tuple[int, ...] = ()) -> JobRequest:
        return JobRequest(self.name, self.top, self.cpus, self.memory_mb, replace=replace_,
                          gaps=frozenset(self.gaps))


class Region:
    def __init__(self, machines: int, seed: int):
        self.rnd = random.Random(seed)
        ms = []
        for i in range(machines):
            msb = i // MSB_SIZE
            ms.append(Machine(f"m{i:06d}", "r1", f"dc{msb % 2 + 1}", f"msb{msb:03d}", f"rack{i // RACK_SIZE:05d}",
                              "generic", float(CORES), MEMORY))
        self.ents = [Entitlement(f"e{k:03d}", "generic", quota=machines) for k in range(max(2, machines // ENT_SIZE))]
        self.snap = Snapshot.build(ms, self.ents)
        self.jobs: dict[str, Job] = {}
        self.on: dict[str, set[tuple[str, int]]] = {m.id: set() for m in ms}  # machine -> its tasks
        self.failed_allocations = 0

    # -- what the history does ----------------------------------------------------------------

    def reserved(self) -> float:
        return sum(self.snap.used(mid)[0] for mid in self.snap.machines) / (CORES * len(self.snap.machines))

    def place(self, job: Job, replace_: tuple[int, ...] = ()) -> bool:
        try:
            p = allocate(self.snap, job.request(replace_))
        except AllocationError:
            self.failed_allocations += 1
            return False
        for i in p.new_tasks:
            old = self.snap.tasks_of(job.name).get(i)
            if old is not None:
                self.on[old.machine_id].discard((job.name, i))
            self.on[p.task_machines[i]].add((job.name, i))
        self.snap.apply_placement(p)
        return True

    def create(self) -> None:
        rnd = self.rnd
        cpus = rnd.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
        count = max(1, min(200, int(rnd.lognormvariate(2.3, 1.0))))
        ent = rnd.choice(self.ents).name
        name = f"{ent}/j{len(self.jobs):06d}"
        job = Job(name, cpus, int(cpus * 4096 * rnd.uniform(0.5, 1.5)), count,
                  share=min(0.95, rnd.lognormvariate(math.log(0.35), 0.5)))
        if self.place(job):
            self.jobs[name] = job

    def remove(self, job: Job, indices: list[int]) -> None:
        touched = {self.snap.tasks_of(job.name)[i].machine_id for i in indices}
        for i in indices:
            self.on[self.snap.tasks_of(job.name)[i].machine_id].discard((job.name, i))
        self.snap.apply(removed_tasks=[(job.name, i) for i in indices])
        for i in indices:
            job.gaps.add(i)
        while job.top and (job.top - 1) in job.gaps:
            job.top -= 1
            job.gaps.discard(job.top)
        self.back_to_pool(touched)

    def back_to_pool(self, machines) -> None:
        empty = [replace(self.snap.machines[mid], entitlement=None) for mid in machines
                 if self.snap.used(mid) == (0.0, 0) and self.snap.machines[mid].entitlement is not None]
        if empty:
            self.snap.apply(machines=empty)

    def live(self, job: Job) -> list[int]:
        return sorted(self.snap.tasks_of(job.name))

    def shrink_srm(self, job: Job, n: int) -> None:
        """The SRM's victims (controlplane/srm/victims.py choose(), as the daemon calls it): the
        tasks on the machines holding the fewest of the entitlement's tasks."""
        placed = self.snap.tasks_of(job.name)
        records = {i: TaskRec(job.name, i, 1, {}, t.machine_id, "running") for i, t in placed.items()}
        on_machine = {t.machine_id: len(self.on[t.machine_id]) for t in placed.values()}
        self.remove(job, choose(records, sorted(placed), on_machine, n))

    def shrink_by_hand(self, job: Job, n: int) -> None:
        self.remove(job, self.live(job)[-n:])

    def grow(self, job: Job, n: int) -> None:
        fill = sorted(job.gaps)[:n]
        job.gaps -= set(fill)
        job.top += n - len(fill)
        if not self.place(job):
            for i in range(job.top - (n - len(fill)), job.top):
                job.gaps.add(i)
            job.gaps |= set(fill)
            while job.top and (job.top - 1) in job.gaps:
                job.top -= 1
                job.gaps.discard(job.top)

    def stop(self, job: Job) -> None:
        self.remove(job, self.live(job))
        del self.jobs[job.name]

    def fail(self) -> None:
        """A machine fails: its tasks are placed elsewhere; it comes back empty, to the free pool."""
        mid = self.rnd.choice(sorted(k for k, v in self.on.items() if v))
        on: dict[str, list[int]] = {}
        for job, i in self.on[mid]:
            on.setdefault(job, []).append(i)
        self.snap.apply(machines=[replace(self.snap.machines[mid], healthy=False)])
        for name, indices in sorted(on.items()):
            job = self.jobs[name]
            if not self.place(job, tuple(sorted(indices))):
                self.remove(job, indices)
        self.snap.apply(machines=[replace(self.snap.machines[mid], healthy=True)])
        self.back_to_pool([mid])

    def history(self, events: int) -> Counter:
        did: Counter = Counter()
        while did["create"] % 50 or self.reserved() < FILL:
            self.create()
            did["create"] += 1
        for _ in range(events):
            jobs = list(self.jobs.values())
            kind = self.rnd.choices(("autoscale", "resize down", "resize up", "stop", "create", "failure"),
                                    (40, 15, 15, 10, 12, 8))[0]
            job = self.rnd.choice(jobs)
            n = len(self.snap.tasks_of(job.name))
            if kind == "autoscale" and n > 1:
                self.shrink_srm(job, max(1, int(n * self.rnd.uniform(0.2, 0.6))))
            elif kind == "resize down" and n > 1:
                self.shrink_by_hand(job, max(1, int(n * self.rnd.uniform(0.1, 0.4))))
            elif kind == "resize up":
                self.grow(job, max(1, int(n * self.rnd.uniform(0.1, 0.5))))
            elif kind == "stop":
                self.stop(job)
            elif kind == "create":
                self.create()
            elif kind == "failure":
                self.fail()
            did[kind] += 1
        return did

    # -- measured usage ------------------------------------------------------------------------

    def usage(self) -> dict[tuple[str, int], int]:
        """Millicores each task uses: its job's share of what it reserves, uneven over the shards."""
        rnd = random.Random(self.rnd.random())
        out = {}
        for j in self.jobs.values():
            for i in self.snap.tasks_of(j.name):
                skew = 2.0 / (1 + i) ** 0.5
                out[(j.name, i)] = min(int(j.cpus * 1000), int(j.cpus * 1000 * j.share * skew * rnd.uniform(0.8, 1.2)))
        return out


# -- the figures -----------------------------------------------------------------------------

def assignment(snap: Snapshot, jobs) -> dict[tuple[str, int], str]:
    return {(j, i): t.machine_id for j in jobs for i, t in snap.tasks_of(j).items()}


def hottest(snap: Snapshot, where: dict, used: dict) -> float:
    cap, use = Counter(), Counter()
    for m in snap.machines.values():
        cap[(m.dc, m.msb)] += m.cpus * 1000
    for key, mid in where.items():
        m = snap.machines[mid]
        use[(m.dc, m.msb)] += used.get(key, 0)
    mean = sum(use.values()) / sum(cap.values())
    return max(use[k] / cap[k] for k in cap) / mean


def held(where: dict) -> set[str]:
    return set(where.values())


def baseline(r: Region, used: dict) -> tuple[Snapshot, int, float]:
    snap = r.snap.copy()
    began = time.perf_counter()
    nodes: dict[str, list[Node]] = {}
    pods: dict[str, list[Pod]] = {}
    for m in snap.machines.values():
        if m.entitlement is not None:
            nodes.setdefault(m.entitlement, []).append(Node(m.id, int(m.cpus * 1000), m.memory_mb))
    for j in r.jobs.values():
        ent = j.name.partition("/")[0]
        for i, t in snap.tasks_of(j.name).items():
            pods.setdefault(ent, []).append(Pod((j.name, i), t.machine_id, j.name, int(t.cpus * 1000), t.memory_mb))
    evicted: list[Pod] = []
    for ent, ns in nodes.items():
        ps = pods.get(ent, [])
        first = low_node_utilization(ns, ps, per_node=PER_NODE)
        gone = {p.key for p in first}
        counts = Counter(p.node for p in first)
        rest = [p for p in ps if p.key not in gone]
        feasible = {p.owner: len(ns) for p in rest}
        second = [p for p in remove_duplicates(rest, feasible, per_node=PER_NODE) if counts[p.node] < PER_NODE]
        evicted += first + second
    by_job: dict[str, list[int]] = {}
    for p in evicted:
        by_job.setdefault(p.owner, []).append(p.key[1])
    snap.apply(removed_tasks=[p.key for p in evicted])
    for name, indices in sorted(by_job.items()):
        try:
            snap.apply_placement(allocate(snap, r.jobs[name].request()))
        except AllocationError:
            r.failed_allocations += 1
    touched = {p.node for p in evicted}
    empty = [replace(snap.machines[mid], entitlement=None) for mid in touched if snap.used(mid) == (0.0, 0)]
    if empty:
        snap.apply(machines=empty)
    return snap, len(evicted), time.perf_counter() - began


@dataclass
class Side:
    """A baseline's round on the same board ours starts from, scored and checked as ours is."""

    name: str
    moves: int
    before: Scores
    after: Scores
    violations: list[str]
    seconds: float

    @property
    def freed(self) -> int:
        return self.before.machines_held - self.after.machines_held


def _start(reg: view.Region, churn: float) -> tuple[Board, Scores, Before, float]:
    """A baseline's board from the region ours starts from, scored and kept for the checker."""
    began = time.perf_counter()
    board = Board(reg, churn)
    before = scores(board)
    return board, before, Before(board, before), began


def _scopes(board: Board, scope) -> dict:
    """The machines of the groups (entitlement, dc, msb), by scope(entitlement, dc, msb)."""
    out: dict = {}
    for (ent, dc, msb), mids in board.in_group.items():
        out.setdefault(scope(ent, dc, msb), []).extend(mids)
    return out


def _done(name: str, board: Board, before: Scores, checked: Before, began: float) -> Side:
    after = scores(board)
    return Side(name, len(board.moves), before, after, violations(checked, board, after), time.perf_counter() - began)


def ca_scale_down(reg: view.Region, same_msb: bool, churn: float = 0.25) -> Side:
    """The Cluster Autoscaler's scale-down (bench/ca.py unneeded(), without its timers: one round on
    a still region) on each entitlement's machines of one MSB (or, same_msb False, of the dc): the
    machines whose tasks request under half of their cpu and memory, drained when each task fits on
    the others by requests (the autoscaler reads requests, not usage), within the same per-job
    budget as ours. Each scan's drains are applied (found on consistent room), then it scans again,
    until nothing changes."""
    board, before, checked, began = _start(reg, churn)
    scope = _scopes(board, (lambda ent, dc, msb: (ent, dc, msb)) if same_msb else (lambda ent, dc, msb: (ent, dc)))
    gone: set[str] = set()
    changed = True
    while changed:
        changed = False
        for key in sorted(scope):
            nodes = {mid: CaNode(board.machines[mid].cpus, board.machines[mid].memory_mb,
                                 {k: (board.tasks[k].cpus, board.tasks[k].memory_mb) for k in board.on[mid]})
                     for mid in scope[key] if mid not in gone}
            for mid, place in unneeded(nodes, lambda mid: board.clear(mid) and all(map(board.movable, board.on[mid]))):
                if not all(map(board.movable, board.on[mid])):
                    continue  # an earlier drain of this scan spent its jobs' budget
                for k, target in sorted(place.items()):
                    board.move(k, target, "ca", f"{mid} under half requested, drained")
                gone.add(mid)
                changed = True
    return _done("ca scale-down" if same_msb else "entitlement-wide", board, before, checked, began)


def high_node(reg: view.Region, churn: float = 0.25) -> Side:
    """The descheduler's HighNodeUtilization (bench/descheduler.py, 20 %, PER_NODE a node) on each
    entitlement's machines; the evicted tasks placed again as the scheduler scoring MostAllocated
    places them: on the fullest machine of the entitlement in the task's dc that holds it by
    requests (possibly the one it left)."""
    board, before, checked, began = _start(reg, churn)
    for ent, mids in sorted(_scopes(board, lambda ent, dc, msb: ent).items()):
        nodes = [Node(mid, board.machines[mid].cpus, board.machines[mid].memory_mb) for mid in mids]
        pods = [Pod(k, mid, k[0], board.tasks[k].cpus, board.tasks[k].memory_mb) for mid in mids for k in board.on[mid]]
        evicted = high_node_utilization(nodes, pods, per_node=PER_NODE)
        for p in evicted:
            t = board.tasks[p.key]
            dc = board.machines[p.node].dc
            fits = [mid for mid in mids if board.machines[mid].dc == dc and board.free_cpus[mid] + (t.cpus if mid == p.node else 0) >= t.cpus
                    and board.free_mem[mid] + (t.memory_mb if mid == p.node else 0) >= t.memory_mb]
            target = min(fits, key=lambda mid: (board.free_cpus[mid] + (t.cpus if mid == p.node else 0), mid))
            if target != p.node:
                board.move(p.key, target, "highnodeutilization", f"{p.node} under 20 % requested")
    return _done("highnodeutilization", board, before, checked, began)


def least_moves(reg: view.Region, n: int) -> int | None:
    """A lower bound on the moves that free n machines by moves within MSBs: each group frees at
    most what its totals allow (compaction._spare: its cpus and memory on the fewest machines), a
    machine freed costs at least one move a task on it, and nothing is cheaper than the groups'
    machines holding fewest tasks; packing, racks, the churn budget and the hotspots' moves are
    left out, so a round needs at least this many. None: the groups' totals cannot spare n."""
    board = Board(reg, 1.0)
    costs: list[int] = []
    for mids in board.in_group.values():
        holding = [mid for mid in mids if board.holds(mid)]
        spare = _spare(board, holding)
        if spare > 0:
            costs += sorted(len(board.on[mid]) for mid in holding if board.clear(mid))[:spare]
    return sum(sorted(costs)[:n]) if n <= len(costs) else None


def least_cooling(reg: view.Region, margin: float) -> int:
    """A lower bound on the moves that bring every MSB to at most the region's mean x (1 + margin)
    of measured cpu: a move takes one task's use out of its MSB, so each MSB above the line needs
    at least its hottest tasks whose use covers its excess (where they could go, the spread and
    the budgets left out; moves within an MSB change no MSB's load; a task whose job spreads over
    racks never leaves its MSB). The budgeted round's own count (cheapest.CoolingLeft), on the
    region as it starts."""
    return CoolingLeft(Board(reg, 1.0, margin=margin))()


def our_region(r: Region, used: dict) -> view.Region:
    groups: dict[tuple, view.Group] = {}
    machines: dict[str, view.Machine] = {}
    cap: Counter = Counter()
    pool, racks = [], {}
    for m in r.snap.machines.values():
        cap[(m.dc, m.msb)] += int(m.cpus * 1000)
        rack = racks.setdefault(m.rack, [0, 0])
        rack[0] += 1
        if m.entitlement is None:
            rack[1] += 1
            pool.append(view.Machine(m.id, "", m.dc, m.msb, int(m.cpus * 1000), m.memory_mb, rack=m.rack,
                                     type=m.machine_type))
            continue
        vm = view.Machine(m.id, m.entitlement, m.dc, m.msb, int(m.cpus * 1000), m.memory_mb, rack=m.rack,
                          type=m.machine_type)
        machines[m.id] = vm
        groups.setdefault((m.entitlement, m.dc, m.msb), view.Group(m.entitlement, m.dc, m.msb)).machines.append(vm)
    for j in r.jobs.values():
        for i, t in r.snap.tasks_of(j.name).items():
            vm = machines[t.machine_id]
            groups[(vm.entitlement, vm.dc, vm.msb)].tasks.append(
                view.Task(j.name, i, t.machine_id, int(t.cpus * 1000), t.memory_mb, used=used[(j.name, i)]))
    return view.Region([groups[k] for k in sorted(groups)], dict(cap), pool,
                       {e.name: e.machine_type for e in r.ents}, {e.name: "web" for e in r.ents}, racks)


def check(r: Region, moves, taken: dict[str, str]) -> tuple[Snapshot, list[str]]:
    """The moves applied to a copy of the allocator's snapshot, and what breaks there (a swap's
    target is a free machine its entitlement takes)."""
    snap = r.snap.copy()
    bad = []
    placed = []
    for mv in moves:
        t = snap.tasks_of(mv.job)[mv.index]
        src, dst = snap.machines[mv.source], snap.machines[mv.target]
        if t.machine_id != mv.source:
            bad.append(f"{mv.job}#{mv.index} is not on {mv.source}")
        if (src.dc, src.entitlement) != (dst.dc, taken.get(dst.id, dst.entitlement)):
            bad.append(f"{mv.job}#{mv.index} left its dc or entitlement")
        placed.append(PlacedTask(mv.job, mv.index, mv.target, t.cpus, t.memory_mb))
    snap.apply(tasks=placed)
    for mid in {mv.target for mv in moves}:
        c, mem = snap.free(mid)
        if c < -1e-9 or mem < 0:
            bad.append(f"{mid} reserves more than it has")
    return snap, bad


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=None, help="churn events after the fill (default: machines / 2)")
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args()
    began = time.perf_counter()
    r = Region(args.machines, args.seed)
    did = r.history(args.events if args.events is not None else args.machines // 2)
    used = r.usage()
    jobs = list(r.jobs)
    where0 = assignment(r.snap, jobs)
    print(f"region: {args.machines} machines of {CORES} cores in {len({(m.dc, m.msb) for m in r.snap.machines.values()})} "
          f"MSBs, {len(r.ents)} entitlements; history ({time.perf_counter() - began:.0f} s): "
          + ", ".join(f"{k} {v}" for k, v in sorted(did.items()))
          + f"; {len(jobs)} jobs, {len(where0)} tasks on {len(held(where0))} machines, "
          f"{r.reserved():.0%} of the region's cores reserved")

    base_snap, n_base, base_s = baseline(r, used)
    where_b = assignment(base_snap, jobs)
    g_freed = len(held(where0)) - len(held(where_b))  # net: the allocator may take free machines
    print(f"baseline (descheduler 20/50 + RemoveDuplicates, {PER_NODE} a node, re-placed by our allocator): "
          f"{n_base} evictions, {g_freed} machines freed (net), {sum(1 for k in where0 if where_b.get(k) == where0[k])} of "
          f"{len(where0)} tasks where they were (some evicted back to their machine), {base_s:.1f} s")

    reg = our_region(r, used)
    rss_before = _rss_mib()
    p = plan(reg)
    rss_after = _rss_mib()
    _, bad = check(r, p.moves, p.taken)
    where_o = dict(where0)
    for mv in p.moves:
        where_o[(mv.job, mv.index)] = mv.target
    f_freed = len(held(where0)) - len(held(where_o))  # net: a swap gives one back and takes another
    by_goal = Counter(mv.goal for mv in p.moves)
    statuses = Counter(x.status for x in p.results)
    print(f"ours: {len(p.moves)} moves ({', '.join(f'{g} {n}' for g, n in sorted(by_goal.items()))}), "
          f"{f_freed} machines freed (net), {len(reg.groups)} groups ("
          + ", ".join(f"{k} {v}" for k, v in statuses.most_common()) + "), "
          f"{len(p.taken)} machines swapped with the free pool (whole free racks {p.racks_free[0]} -> "
          f"{p.racks_free[1]}), hot machines {p.before.hot_machines} -> {p.after.hot_machines}, spread excess "
          f"{p.before.spread_excess} -> {p.after.spread_excess}; memory: {rss_before} MiB resident before the round "
          f"(the region, its history, the baseline), {rss_after} after it; peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB (the whole benchmark)")
    for line in p.violations[:5] + tuple(bad[:5]):
        print("  violation:", line)
    hb = hottest(r.snap, where_b, used)
    print(f"descheduler LowNodeUtilization + RemoveDuplicates: hottest MSB x{hb:.2f} of mean (the issue #27 baseline, "
          f"for reference)")
    sides = [ca_scale_down(reg, True), ca_scale_down(reg, False), high_node(reg)]
    for side in sides:
        print(f"{side.name}: {side.moves} moves, {side.freed} machines freed, spread excess {side.before.spread_excess} "
              f"-> {side.after.spread_excess}, hottest MSB x{side.after.hottest_msb:.2f} of mean, hot machines "
              f"{side.before.hot_machines} -> {side.after.hot_machines}, {len(side.violations)} violations by the plan "
              f"checker (score.py){': ' + '; '.join(side.violations[:3]) if side.violations else ''}, {side.seconds:.1f} s")
    ca, wide, hnu = sides
    w = sum(len(s.violations) for s in sides)
    # ours within the autoscaler's moves: the same region, a budget of the ca scale-down's moves
    q = plan(reg, max_moves=ca.moves, margin=HOTTEST - 1)
    _, bad_q = check(r, q.moves, q.taken)
    by_goal_q = Counter(mv.goal for mv in q.moves)
    print(f"ours within the ca scale-down's {ca.moves} moves (?max_moves={ca.moves}, margin {HOTTEST - 1:.0%}): "
          f"{len(q.moves)} moves ({', '.join(f'{g} {n}' for g, n in sorted(by_goal_q.items()))}), "
          f"{q.before.machines_held - q.after.machines_held} machines freed, spread excess {q.before.spread_excess} -> "
          f"{q.after.spread_excess}, hottest MSB x{q.after.hottest_msb:.2f} of mean, hot machines "
          f"{q.before.hot_machines} -> {q.after.hot_machines}, {len(q.violations) + len(bad_q)} violations, "
          f"{q.seconds:.1f} s")
    for line in q.violations[:5] + tuple(bad_q[:5]):
        print("  violation:", line)

    def goals_of(x, bad_x) -> list[tuple[str, bool]]:
        freed_x = x.before.machines_held - x.after.machines_held
        return [(f"freed >= 1.15 x max(ca scale-down, highnodeutilization) = {1.15 * max(ca.freed, hnu.freed):.0f}",
                 freed_x >= 1.15 * max(ca.freed, hnu.freed)), ("moves <= ca scale-down's", len(x.moves) <= ca.moves),
                ("spread excess <= ca scale-down's", x.after.spread_excess <= ca.after.spread_excess),
                (f"hottest MSB <= {HOTTEST:.2f}", x.after.hottest_msb <= HOTTEST),
                ("no violation", len(x.violations) + len(bad_x) == 0), ("solve <= 10 s", x.seconds <= 10)]

    want = math.ceil(1.15 * max(ca.freed, hnu.freed))
    bound = least_moves(reg, want)
    print(f"how few moves could free {want} machines (1.15 x max(ca scale-down, highnodeutilization)) within their "
          f"MSBs: at least {bound if bound is not None else 'no number of'} (each group's machines holding fewest "
          f"tasks, as many as its totals could spare, a move a task; packing, racks and budgets left out), beside "
          f"the ca scale-down's {ca.moves}; ours cooled the hottest MSB with {by_goal.get('hotspots', 0)} moves more")
    print(f"how few moves could cool every MSB to x{HOTTEST:.2f} of the mean: at least {least_cooling(reg, HOTTEST - 1)} "
          f"(each hot MSB's hottest tasks until their use covers its excess; the round within the ca scale-down's "
          f"moves made {by_goal_q.get('hotspots', 0)}); these and the freeing's overlap only where a task moved out of "
          f"a hot MSB empties its machine")
    for name, x, bad_x in (("the round without a budget", p, bad), ("the round within the ca scale-down's moves", q, bad_q)):
        print(f"issue #36's goals (set at 10,000 machines; here {args.machines:,}), {name}: "
              + "; ".join(f"{g} {'met' if ok else 'NOT MET'}" for g, ok in goals_of(x, bad_x)))
    print(f"wall time {time.perf_counter() - began:.0f} s")
    for x, bad_x in ((p, bad), (q, bad_q)):
        print(f"rebalancer: freed {x.before.machines_held - x.after.machines_held} machines (ca scale-down {ca.freed}, "
              f"entitlement-wide {wide.freed}, highnodeutilization {hnu.freed}) with {len(x.moves)} moves (ca scale-down "
              f"{ca.moves}); spread excess {x.after.spread_excess} (ca scale-down {ca.after.spread_excess}); hottest MSB "
              f"x{x.after.hottest_msb:.2f} of mean; violations {len(x.violations) + len(bad_x)} (baselines {w}); solve "
              f"{x.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
