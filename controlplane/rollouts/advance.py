"""The rollout's steps, pure: from the record and what is known of the entitlement's machines now,
the record moved forward and what happened, in words (each an event). The shard leader's driver
(driver.py) calls it on every pass and commits what changed; the API's pause, resume and rollback
call the functions at the bottom.

One batch at a time: at most `max_unavailable` machines, spread over MSBs (one of each MSB in
turn), healthy ones only. A batch ends when each of its machines is done (or failed): a failed
batch pauses the rollout, or with `auto_rollback` begins rolling the changed machines back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from controlplane.rollouts.record import ACTIVE, IN_BATCH, MIN_READY, doc_hash, doc_name, holds_source, label, \
    pending, target
from controlplane.store.records import ON_MACHINE


@dataclass(frozen=True)
class TaskView:
    key: str  # "<job>#<index>"
    state: str
    reason: str = ""
    restarts: int = 0  # its container's restarts, as its agent last reported them
    # its agent saw its container run 5 s or more after it started (agent/report.py: on the agent's
    # own clock, so a crash the control plane hears of late cannot pass for a task that ran);
    # None: the agent does not say
    steady: bool | None = None


@dataclass(frozen=True)
class MachineView:
    id: str
    msb: str = ""
    healthy: bool = True
    health_reason: str = ""
    applied: str | None = None  # the profile its agent reports applied (name or file as asked for)
    applied_hash: str | None = None
    ok: bool = True
    error: str = ""
    tasks: tuple[TaskView, ...] = ()  # the tasks of live jobs on it


# times a machine may go down while it drains before the rollout pauses (one that keeps going down
# would otherwise take its turn again for ever)
REQUEUES = 3
Note = tuple[str, list[str]]  # what happened, in words, and the machines it names (an event)


def advance(r: dict, machines: dict[str, MachineView], now: float) -> tuple[dict, list[Note]]:
    """The rollout moved forward (a copy; the same object when nothing changed) and the events."""
    if r["state"] not in ACTIVE:
        return r, []
    new = copy.deepcopy(r)
    notes: list[Note] = []
    for mid in [mid for mid in new["machines"] if mid not in machines]:
        del new["machines"][mid]  # back in the free pool (its profile rolled back as ever), or gone
    for mid, m in new["machines"].items():
        if m["phase"] in IN_BATCH:
            _step_machine(new, mid, m, machines[mid], now)
    _end_batch(new, machines, now, notes)
    if new["state"] in ("rolling", "rolling_back") and not _in_batch(new):
        _next_batch(new, machines, now, notes)
    if new == r:
        return r, []
    new["updated"] = now
    return new, notes


def _in_batch(r: dict) -> list[str]:
    return [mid for mid, m in r["machines"].items() if m["phase"] in IN_BATCH]


def _fail(m: dict, why: str) -> None:
    m.update(phase="failed", why=why)


def _step_machine(r: dict, mid: str, m: dict, v: MachineView, now: float) -> None:
    deadline = float(r["policy"]["deadline"])
    tgt = target(r)
    if m["phase"] == "draining":
        if not v.healthy:
            # down before its switch: it leaves the batch unswitched and waits for its turn again,
            # to be drained, switched and seen running like any other (were it done now, it would
            # take the new profile when back with its tasks never stopped, never seen running under
            # it, and the batch would pass a profile nobody saw work); still down when no healthy
            # machine is left, it is done then and applies the target when back (_next_batch)
            m.update(pending(), why=f"went down before its switch ({v.health_reason}): its turn comes again",
                     requeued=m.get("requeued", 0) + 1)
        elif not any(t.state in ON_MACHINE for t in v.tasks):
            # an error its agent reported before (the profile it failed on, before a rollback) is not this switch's
            m.update(phase="switching", since=now, tasks=sorted(t.key for t in v.tasks), stale_error=v.error)
        return
    if not v.healthy:
        _fail(m, f"{mid} went down {'during its switch' if m['phase'] == 'switching' else 'after its switch'}: "
                 f"{v.health_reason}")
        return
    if m["phase"] == "switching":
        # (an agent that does not report hashes is taken at its name)
        if v.applied == doc_name(tgt) and v.ok and (doc_hash(tgt) is None or v.applied_hash in (None, doc_hash(tgt))):
            m.update(phase="starting", since=now, ready_since=None, restarts=None)
        elif not v.ok and v.error and v.error != m.get("stale_error"):
            _fail(m, f"the agent could not apply {label(tgt)}: {v.error}")
        elif now - m["since"] > deadline:
            _fail(m, f"the agent did not report {label(tgt)} applied within {deadline:g} s")
        return
    down = [t for t in v.tasks if t.state != "running"]
    # A task that restarted since the last look is not running steadily, whatever the samples say
    # (a container crashing at once and restarted between two reports shows "running" in each).
    restarts = {t.key: t.restarts for t in v.tasks}
    restarted = [t for t in v.tasks if m.get("restarts") is not None and t.restarts > m["restarts"].get(t.key, t.restarts)]
    unsteady = [t for t in v.tasks if t.state == "running" and t.steady is False]
    m["restarts"] = restarts
    if down or restarted:
        m["ready_since"] = None if down else now
    elif m["ready_since"] is None:
        m["ready_since"] = now
    if (down or restarted or unsteady) and now - m["since"] > deadline:
        why = [f"{t.key} {t.state}{': ' + t.reason if t.reason else ''}" for t in down[:5]] if down else \
            [f"{t.key} restarting ({t.restarts} restarts)" for t in restarted[:5]] if restarted else \
            [f"{t.key} not steady (its agent never saw it run 5 s; {t.restarts} restarts)" for t in unsteady[:5]]
        _fail(m, f"tasks not running {deadline:g} s after the switch: " + "; ".join(why))
        return
    if not down and not unsteady and m["phase"] == "starting" and now - m["ready_since"] >= MIN_READY:
        m.update(phase="done", why="")


def _end_batch(r: dict, machines: dict[str, MachineView], now: float, notes: list[Note]) -> None:
    if not r["batches"] or r["batches"][-1]["ended"] is not None:
        return
    b = r["batches"][-1]
    mine = {mid: r["machines"][mid] for mid in b["machines"] if mid in r["machines"]}
    if any(m["phase"] in IN_BATCH for m in mine.values()):
        return
    failed = {mid: m["why"] for mid, m in mine.items() if m["phase"] == "failed"}
    switched = [mid for mid, m in mine.items() if m["phase"] == "done"]
    waiting = sorted(mid for mid, m in mine.items() if m["phase"] == "pending")
    b.update(ended=now, outcome="failed" if failed else "done" if switched or not waiting else "requeued",
             why="; ".join(f"{mid}: {m['why']}" for mid, m in sorted(mine.items()) if mid in (failed or waiting)))
    what = "rollback batch" if b["back"] else "batch"
    if waiting:
        notes.append((f"{what} {b['n']}: {', '.join(waiting)} went down before the switch and wait for a batch "
                      "again", waiting))
    if not failed:
        if switched:
            notes.append((f"{what} {b['n']} done: {', '.join(switched)} hold {label(target(r))}", switched))
        flapping = [mid for mid in waiting if mine[mid].get("requeued", 0) >= REQUEUES]
        if flapping and r["state"] in ("rolling", "rolling_back"):  # still on the old profile: a person looks
            r.update(paused_from=r["state"], state="paused",
                     why=f"{', '.join(flapping)} went down before the switch {REQUEUES} times")
        return
    notes.append((f"{what} {b['n']} failed: {b['why']}", sorted(failed)))
    if r["state"] == "rolling" and r["policy"]["auto_rollback"]:
        reverse(r, machines, f"batch {b['n']} failed: {b['why']}", now)
        notes.append((f"rolling back to {label(r['from'])} (auto_rollback): {', '.join(sorted(r['machines'])) or 'no machine'}"
                      " changed", sorted(r["machines"])))
    elif r["state"] in ("rolling", "rolling_back"):
        r.update(paused_from=r["state"], state="paused", why=f"{what} {b['n']} failed: {b['why']}")


def _next_batch(r: dict, machines: dict[str, MachineView], now: float, notes: list[Note]) -> None:
    waiting = sorted(mid for mid, m in r["machines"].items() if m["phase"] == "pending")
    healthy = [mid for mid in waiting if machines[mid].healthy]
    if not healthy:
        for mid in waiting:  # down: nothing runs there; each applies the target when it is back
            r["machines"][mid].update(phase="done", why=f"down ({machines[mid].health_reason}): it applies "
                                                        f"{label(target(r))} when back", since=now)
        final = "rolled_back" if r["state"] == "rolling_back" else "done"
        r.update(state=final)
        notes.append((f"rollout {'rolled back' if final == 'rolled_back' else 'done'}: the machines hold "
                      f"{label(target(r))}", []))
        return
    by_msb: dict[str, list[str]] = {}
    for mid in healthy:
        by_msb.setdefault(machines[mid].msb, []).append(mid)
    chosen: list[str] = []
    k = max(1, int(r["policy"]["max_unavailable"]))
    while len(chosen) < k and any(by_msb.values()):
        for msb in sorted(by_msb, key=lambda s: (-len(by_msb[s]), s)):
            if by_msb[msb] and len(chosen) < k:
                chosen.append(by_msb[msb].pop(0))
    n = len(r["batches"]) + 1
    back = r["state"] == "rolling_back"
    for mid in chosen:
        r["machines"][mid].update(phase="draining", batch=n, since=now, ready_since=None, why="")
    r["batches"].append({"n": n, "machines": chosen, "began": now, "ended": None, "outcome": None, "why": "",
                         "back": back})
    notes.append((f"{'rollback batch' if back else 'batch'} {n}: {', '.join(chosen)} "
                  f"({', '.join(sorted({machines[m].msb or '-' for m in chosen}))}) to {label(target(r))}, "
                  f"{len(waiting) - len(chosen)} machine(s) after it", chosen))


# -- what an operator asks (the API), and what a failed batch does ---------------------------------

def reverse(r: dict, machines: dict[str, MachineView] | list[str], why: str, now: float) -> None:
    """Roll back, in place: every machine that holds (or failed on) the new profile goes back to
    the old one in batches, the machines of the entitlement that joined meanwhile too; those not
    switched yet leave the rollout (their stopped tasks start again) and never change."""
    if r["id"].endswith("-baseline"):
        raise ValueError(f"no rollout to roll back: the machines of {r['entitlement']} have held {label(r['to'])} "
                         "since it was created")
    if r["state"] in ("rolling_back", "rolled_back") or r.get("paused_from") == "rolling_back":
        raise ValueError(f"rollout {r['id']} is already {r['state'].replace('_', ' ')}"
                         + (" (a rollback paused: resume it)" if r["state"] == "paused" else ""))
    listed = r["machines"]
    back = {mid: pending() for mid in machines if mid not in listed or not holds_source(listed[mid])}
    r.update(state="rolling_back", why=why, machines=back, paused_from=None, updated=now)


def pause(r: dict, why: str, now: float) -> None:
    if r["state"] not in ("rolling", "rolling_back"):
        raise ValueError(f"rollout {r['id']} is {r['state'].replace('_', ' ')}: only one in progress pauses")
    r.update(paused_from=r["state"], state="paused", why=why, updated=now)


def resume(r: dict, now: float) -> None:
    """Go on where it paused; the machines that failed switch again first (their batch goes on:
    their tasks stopped, the profile applied, the tasks started). They hold the target already
    (`on_target`): drained again, they keep it, not switched back under their running tasks."""
    if r["state"] != "paused":
        raise ValueError(f"rollout {r['id']} is {r['state'].replace('_', ' ')}, not paused")
    retried = [mid for mid, m in r["machines"].items() if m["phase"] == "failed"]
    for mid in retried:
        r["machines"][mid].update(phase="draining", since=now, ready_since=None, why="", on_target=True)
    if retried and r["batches"]:
        r["batches"][-1].update(ended=None, outcome=None, why="")
    r.update(state=r.get("paused_from") or "rolling", paused_from=None, why="", updated=now)
