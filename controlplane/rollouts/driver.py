"""The rollouts of a scheduler shard's entitlements, driven by the shard's leader (its one writer):
every INTERVAL seconds it
- pins the profile of an entitlement that has no rollout record yet (a baseline: nothing changes);
- starts a rollout when the entitlement's profile changed: another name (PATCH), or the same name
  whose file changed on the control host (its merged content's hash), unless that content is the
  one a rollout rolled back (`rejected`); a change during a rollout waits until it ends;
- moves each active rollout forward (advance.py) and commits the record with an event a batch,
  guarded by the record's revision and fenced by the shard's leadership (an API's pause, resume or
  rollback in between makes the commit a conflict: the next pass starts from it).
A rollout rolled back to another profile name puts that name back in the entitlement's record.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Callable, Mapping

from controlplane.rollouts.advance import MachineView, Note, TaskView, advance
from controlplane.rollouts.record import FINAL, baseline, begin, doc_hash, doc_name, label, target
from controlplane.scheduler.periodic import every
from controlplane.scheduler.writer import ShardWriter
from controlplane.store import Conflict
from controlplane.store.records import EntitlementRec, EventRec
from controlplane.store.state import RegionState

log = logging.getLogger("twine.controld.rollouts")
INTERVAL = 1.0
Reports = Callable[[str], Mapping[tuple[str, int], dict] | None]  # a machine's last task report (scheduler's)


def wanted_doc(st: RegionState, profile: str | None) -> dict | None:
    """The entitlement's profile as the control host has it now ({name, hash: None} when it
    cannot load it: the agents look the name up)."""
    if profile is None:
        return None
    doc = st.profiles.document(profile) if st.profiles is not None else None
    return doc if doc is not None else {"name": profile, "hash": None, "sections": None}


def machine_views(st: RegionState, entitlement: str, reports: Reports | None = None) -> dict[str, MachineView]:
    """The entitlement's machines as a rollout sees them; `reports`: each machine's last task report
    from its agent (each task's restarts, and whether it is steady), where this process has them."""
    out = {}
    for m in st.machines_of(entitlement):
        tasks = []
        seen = reports(m.id) if reports is not None else None
        for t in st.tasks_on(m.id):
            job = st.jobs.get(t.job)
            if t.machine == m.id and job is not None and job.state == "active" and job.live(t.index):
                r = (seen or {}).get((t.job, t.index)) or {}
                steady = r.get("steady")
                tasks.append(TaskView(f"{t.job}#{t.index}", t.state, t.reason, int(r.get("restarts") or 0),
                                      None if steady is None else bool(steady)))
        out[m.id] = MachineView(m.id, str(m.labels.get("msb", "")), m.healthy, m.health_reason, m.profile_applied,
                                m.profile_hash, m.profile_ok, m.profile_error, tuple(tasks))
    return out


def next_record(st: RegionState, name: str, now: float, ent: EntitlementRec | None = None,
                reports: Reports | None = None) -> tuple[dict | None, list[Note]]:
    """The entitlement's rollout record as it should be now (None: unchanged), and its events.
    `ent`: the entitlement as a request is about to write it (its record here otherwise)."""
    ent = ent or st.entitlements[name]
    r = st.rollouts.get(name)
    want = wanted_doc(st, ent.profile)
    if r is None:
        return baseline(name, want, now), []
    if r["state"] in FINAL:
        pinned = target(r)
        renamed = doc_name(pinned) != ent.profile
        edited = not renamed and doc_hash(want) is not None and doc_hash(want) not in (doc_hash(pinned), r.get("rejected"))
        if not (renamed or edited):
            return None, []
        views = machine_views(st, name)
        machines = sorted(views)
        new = begin(name, pinned, want, machines, ent.rollout, now)
        why = "its file changed on the control host" if edited else "the entitlement's profile changed"
        notes: list[Note] = [(f"rollout {new['id']} begins: {label(pinned)} -> {label(want)} ({why}), "
                              f"{len(machines)} machine(s), {new['policy']['max_unavailable']} at a time", [])]
        r = new
    else:
        notes, views = [], machine_views(st, name, reports)
    moved, more = advance(r, views, now)
    if moved["state"] == "rolled_back" and r["state"] != "rolled_back":
        moved["rejected"] = doc_hash(moved["to"])
    return moved, notes + more


def events(st: RegionState, name: str, notes: list[Note], now: float) -> dict[str, dict]:
    """The events of a rollout's step (kind `rollout`), by key."""
    out = {}
    for i, (note, machines) in enumerate(notes):
        e = EventRec(f"rollout-{int(now * 1000)}-{name}-{i}", "rollout", tuple(machines), now, note, end=now,
                     scope=name, created=now)
        out[st.keys.event(e.id)] = e.to_json()
    return out


class RolloutDriver:
    def __init__(self, state: RegionState, writer: ShardWriter, shard: int, lock: asyncio.Lock,
                 interval: float = INTERVAL, reports: Reports | None = None):
        self.state, self.writer, self.shard, self.lock = state, writer, shard, lock
        self.reports = reports
        self.interval = interval
        self.counters = {"commits": 0, "conflicts": 0, "errors": 0}

    async def run(self) -> None:
        await every(self.interval, self.state, self.step, self.counters, log, f"shard {self.shard}: rollouts")

    async def step(self, now: float) -> None:
        for name in sorted(n for n, e in self.state.entitlements.items() if e.shard == self.shard):
            async with self.lock:
                if name not in self.state.entitlements:
                    continue
                record, notes = next_record(self.state, name, now, reports=self.reports)
                if record is None or record is self.state.rollouts.get(name):
                    continue
                try:
                    await self.commit(name, record, notes, now)
                except Conflict:
                    self.counters["conflicts"] += 1

    async def commit(self, name: str, record: dict, notes: list[Note], now: float) -> None:
        st, keys = self.state, self.state.keys
        txn = self.writer.txn()
        key, ekey = keys.rollout(name), keys.entitlement(name)
        txn.guards[key] = st.guard(key)
        txn.guards[ekey] = st.guard(ekey)  # its profile, and its shard (a move to another shard fences this)
        txn.puts[key] = record
        ent = st.entitlements[name]
        if record["state"] == "rolled_back" and ent.profile != doc_name(record["from"]):
            txn.puts[ekey] = replace(ent, profile=doc_name(record["from"])).to_json()
        txn.puts.update(events(st, name, notes, now))
        rev = await self.writer.send(txn)
        self.counters["commits"] += 1
        for note, _ in notes:
            log.info("entitlement %s: %s", name, note)
        await st.wait_for(rev)

