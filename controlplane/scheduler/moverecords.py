"""A job's rebalance record (`rebalance/<job>`): the ReBalancer's move requests for the job, which
the API (a round: POST /v1/rebalance/apply, or the continuous mode) writes, and the job's recent
moves, which its shard leader writes as it carries them out (moves.py). Both writers guard the
record by its revision, so neither loses what the other wrote.

    {"requests": {"<index>": {"source", "target", "goal", "why", "round", "asked"}},
     "recent": {"<index>": {"at", "target", "outcome"}}}

`recent` is what the next rounds leave alone (the cool-down): a task moved, refused, or whose move
was dropped or given up within COOL_DOWN seconds is not proposed again. Each move that ended is an
event (kind `rebalance`) too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

from controlplane.allocator.snapshot import Snapshot
from controlplane.rollouts.record import phase, reprofile_of
from controlplane.scheduler.ops import MachineStatus
from controlplane.scheduler.moves import move_id
from controlplane.scheduler.reconcile import JobPlan
from controlplane.store.keys import Keys
from controlplane.store.records import EventRec, JobRec, TaskRec
from controlplane.taskcontrol.session import DECLINED, TaskControlSession

if TYPE_CHECKING:
    from controlplane.store.state import RegionState

COOL_DOWN = 3600.0  # seconds a task the ReBalancer moved (or tried to) is left alone


def moves_of(record: dict | None) -> dict[int, dict]:
    """The move requests of a job's rebalance record, by task index (what is not a request is left out)."""
    out = {}
    for k, v in ((record or {}).get("requests") or {}).items():
        if isinstance(v, dict) and isinstance(v.get("target"), str) and str(k).isdigit():
            out[int(k)] = v
    return out


def vet_requests(requests: Mapping[int, dict], tasks: Mapping[int, TaskRec], session: TaskControlSession | None,
                 snapshot: Callable[[], Snapshot]) -> tuple[dict[int, dict], dict[int, str]]:
    """The requests that may go on to the reconciler, and those dropped, with why: declined by the
    job's TaskController, or no room for the task on the target now (the plan was made earlier)."""
    ok: dict[int, dict] = {}
    dropped: dict[int, str] = {}
    snap = None
    for i, req in sorted(requests.items()):
        n = session.declined.get(move_id(i, req["target"]), 0) if session is not None else 0
        if n >= DECLINED:
            dropped[i] = f"refused by the job's TaskController ({n} answers without an ack)"
            continue
        t = tasks.get(i)
        if t is not None and t.moving is None:
            snap = snap or snapshot()
            if req["target"] not in snap.machines:
                dropped[i] = f"{req['target']} is gone"
                continue
            m, ent = snap.machines[req["target"]], t.job.partition("/")[0]
            if req.get("take"):  # a swap: the target is a free machine the entitlement takes
                e = snap.entitlements.get(ent)
                if m.entitlement not in (None, ent):
                    dropped[i] = f"{m.id} is no longer in the free pool (entitlement {m.entitlement} took it)"
                    continue
                if m.entitlement is None and e is not None and snap.held(ent) + 1 > e.quota:
                    dropped[i] = f"entitlement {ent} holds {snap.held(ent)} of its quota of {e.quota} machines: " \
                                 f"no room to take {m.id} for a swap"
                    continue
                if e is not None and m.machine_type != e.machine_type:
                    dropped[i] = f"{m.id} is a {m.machine_type} machine, not {e.machine_type}"
                    continue
            elif m.entitlement != ent:
                dropped[i] = f"{m.id} is no longer entitlement {ent}'s"
                continue
            cpus, mem = snap.free(req["target"])
            need_cpus, need_mem = t.resources
            if cpus + 1e-9 < need_cpus or mem < need_mem:
                dropped[i] = f"{req['target']} has no room for it now ({cpus:g} cpus, {mem} MiB free)"
                continue
        ok[i] = req
    return ok, dropped


def moves_written(keys: Keys, handle: str, record: dict | None, plan: JobPlan, now: float,
                  asked: Mapping[int, dict] | None = None) -> dict[str, dict]:
    """The job's rebalance record after this plan (requests begun or dropped leave it; each goes
    to `recent`), and an event for each move that ended. `asked`: the requests the pass had (the
    record's, and a profile rollout's moves, which no record holds)."""
    record = record or {}
    requests = {k: v for k, v in (record.get("requests") or {}).items()
                if not (str(k).isdigit() and (int(k) in plan.dropped or int(k) in plan.begun))}
    recent = {k: v for k, v in (record.get("recent") or {}).items()
              if isinstance(v, dict) and now - float(v.get("at", 0)) < COOL_DOWN}
    asked = moves_of(record) if asked is None else asked
    for i, why in plan.dropped.items():
        recent[str(i)] = {"at": now, "target": asked.get(i, {}).get("target"), "outcome": f"dropped: {why}"}
    for i in plan.begun:
        recent[str(i)] = {"at": now, "target": asked.get(i, {}).get("target"), "outcome": "moving"}
    out: dict[str, dict] = {}
    for i, source, mv, outcome in plan.ended:
        recent[str(i)] = {"at": now, "target": mv.machine, "outcome": outcome}
        e = EventRec(f"rebalance-{int(now * 1000)}-{handle.replace('/', '.')}-{i}", "rebalance",
                     (source, mv.machine), mv.since, f"{handle}#{i} from {source} to {mv.machine}: {outcome} "
                     f"({mv.goal}: {mv.why})", end=now, scope=handle, created=now)
        out[keys.event(e.id)] = e.to_json()
    out[keys.rebalance(handle)] = {"requests": requests, "recent": recent}
    return out


def cooling(records: Mapping[str, dict], now: float) -> set[tuple[str, int]]:
    """The tasks a round leaves alone: requested and not yet begun, or moved (or tried) within COOL_DOWN."""
    out = set()
    for handle, record in records.items():
        for k, v in ((record or {}).get("recent") or {}).items():
            if str(k).isdigit() and isinstance(v, dict) and now - float(v.get("at", 0)) < COOL_DOWN:
                out.add((handle, int(k)))
        out.update((handle, i) for i in moves_of(record))
    return out


def reprofile_moves(st: "RegionState", job: JobRec, tasks: Mapping[int, TaskRec], machines: Mapping[str, MachineStatus],
                    session: TaskControlSession | None) -> dict[int, dict]:
    """For a job with `update.reprofile: move`: a move request for each of its running tasks on a
    machine a profile rollout is draining, to a machine not in the rollout's batch: one that holds
    the new profile already (its entitlement's, or a free one it takes, which gets it), else one
    of its entitlement's not switched yet; of those, in the MSB with the fewest of the job's tasks,
    then the best fit (the allocator's rules). None for a task whose move the controller refused (it is
    stopped in place instead) or that nothing fits."""
    out: dict[int, dict] = {}
    snap = st.snapshot()
    ent = st.entitlements.get(job.entitlement)
    rollout = st.rollouts.get(job.entitlement)
    for i, t in sorted(tasks.items()):
        m = machines.get(t.machine) if t.machine else None
        if m is None or m.reprofile is None or not m.reprofile.stops or t.state != "running" or t.moving is not None \
                or not job.live(i) or t.spec_version != job.spec_version:
            continue
        if session is not None and any(k.startswith(f"move/{i}/") and n >= DECLINED for k, n in session.declined.items()):
            continue
        need_cpus, need_mem = t.resources
        best: tuple | None = None
        for c in snap.machines.values():
            if c.id == t.machine or not c.schedulable or c.machine_type != (ent.machine_type if ent else c.machine_type):
                continue
            if c.entitlement not in (None, job.entitlement) or reprofile_of(rollout, c.id) is not None:
                continue
            cpus, mem = snap.free(c.id)
            if cpus + 1e-9 < need_cpus or mem < need_mem:
                continue
            # a machine with the new profile (no second move when its turn comes), in the MSB with
            # the fewest of the job's other tasks (its spread), its own before a free one, the best fit
            spread = sum(1 for j, o in tasks.items() if j != i and o.machine in snap.machines
                         and snap.machines[o.machine].msb == c.msb)
            key = (phase(rollout, c.id) == "pending", spread, c.entitlement is None, cpus - need_cpus, c.id)
            if best is None or key < best:
                best = key
        if best is not None:
            out[i] = {"source": t.machine, "target": best[4], "goal": "reprofile", "take": best[2],
                      "why": f"{t.machine} switches its profile ({m.reprofile.what})"}
    return out
