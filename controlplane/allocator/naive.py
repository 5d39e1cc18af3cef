"""The full-scan reference allocator: for each task, look at every machine in the region, keep
those that meet the hard requirements, score them, pick the best. Same rules and tie-breaks as
`allocate.place`, no index; the tests check the two agree and the benchmark measures the
difference. The requirement checks are written inline (as a careful full-scan allocator would,
rather than a method call per filter per machine) so the baseline is not slow for a bad reason."""

from __future__ import annotations

from .allocate import no_fit
from .model import EPSILON, JobRequest, Placement
from .preferences import BinCounts, bin_scores, bin_ties
from .request import build_placement, resolve, split_tasks
from .snapshot import Snapshot
from .overlay import Overlay


def allocate_naive(snapshot: Snapshot, request: JobRequest) -> Placement:
    req = resolve(snapshot, request)
    r, ent = req.request, req.entitlement
    kept, to_place = split_tasks(snapshot, req)
    overlay = Overlay(snapshot, ent.name)
    counts = BinCounts(req.preferences)
    task_machines = [""] * r.count
    for i, mid in kept.items():
        task_machines[i] = mid
        counts.add(snapshot.machines[mid])
    dcs = {f.dc for f in req.dcs}
    need_cpus, need_mem = r.cpus - EPSILON, r.memory_mb
    for i in to_place:
        allow_free = overlay.held() < ent.quota
        left: dict[str, int] = {}  # dc -> free machines of the type (for the reserve)
        if allow_free and ent.reserve:
            for m in snapshot.machines.values():
                if m.machine_type == req.machine_type and m.schedulable and overlay.owner(m.id) is None:
                    left[m.dc] = left.get(m.dc, 0) + 1
        survivors = []  # (bin, tier, free cpus, free memory, machine id, machine)
        for m in snapshot.machines.values():
            if m.machine_type != req.machine_type or not m.schedulable or (dcs and (len(dcs) > 1 or m.dc not in dcs)):
                continue
            owner = overlay.owner(m.id)
            free_ok = allow_free and owner is None and (not ent.reserve or left[m.dc] > ent.reserve)
            if owner != ent.name and not free_ok:
                continue
            c, mem = overlay.free(m.id)
            if c >= need_cpus and mem >= need_mem:
                survivors.append((m.path(req.level), 0 if owner == ent.name else 1, c, mem, m.id, m))
        if not survivors:
            raise no_fit(snapshot, req, overlay, i)
        paths = sorted({s[0] for s in survivors})
        score = dict(zip(paths, bin_scores(req.preferences, counts, paths)))
        tie = dict(zip(paths, bin_ties(req.preferences, counts, paths)))
        m = min(survivors, key=lambda s: (-score[s[0]], tie[s[0]], s[1], s[2], s[3], s[4]))[5]
        overlay.consume(m, r.cpus, r.memory_mb, m.path(req.level))
        counts.add(m)
        task_machines[i] = m.id
    return build_placement(snapshot, req, task_machines, to_place)
