"""An entitlement's host-profile rollout record (`rollouts/<entitlement>`), written only by the
leader of the entitlement's shard (driver.py), read by everyone: it says which profile document
each machine of the entitlement should hold, so that a profile change reaches the machines in
batches instead of all at once.

    {"id", "entitlement", "from": DOC | null, "to": DOC | null,
     "state": rolling | paused | rolling_back | done | rolled_back, "why",
     "policy": {"max_unavailable", "auto_rollback", "deadline"},
     "machines": {"<id>": {"phase", "batch", "since", "ready_since", "why", "tasks"[, "requeued", "on_target"]}},
     "batches": [{"n", "machines", "began", "ended", "outcome", "why", "back"}],
     "rejected": "<hash>" | null, "created", "updated"}

DOC is the profile as the sidekick sends it ({name, hash, sections}; hash and sections null when
the control host cannot load it and agents look the name up themselves), pinned in the record: a
machine not yet switched keeps the old content even after the file changed on the control host.

A machine's phases in a rollout: pending -> draining (its tasks are offered to their jobs'
TaskControllers as `reprofile` operations and stopped) -> switching (its desired profile is the
new one; the agent applies and verifies it) -> starting (its tasks start again) -> done (they ran
for MIN_READY seconds, and their agent reports each steady: seen running 5 s after its container
started); or failed (the agent could not apply it, the machine went down during or after its
switch, or its tasks did not run within the deadline). A machine that goes down while it drains
goes back to pending, on the old profile, and takes its turn again (advance.py REQUEUES). A
failed machine an operator's resume drains again keeps the target it holds (`on_target`), not
switched back under its running tasks. A rollback runs the same phases towards the old profile for
the machines that changed (`back` batches); the others never change, and a paused rollback changes
no machine's profile (its direction is `paused_from`'s: backwards()).
"""

from __future__ import annotations

from typing import Any

from controlplane.scheduler.ops import Reprofile

ACTIVE = ("rolling", "paused", "rolling_back")
FINAL = ("done", "rolled_back")
HOLDS_OLD = ("pending", "draining")  # phases in which a machine still holds the profile it had
STOPPED = ("draining", "switching")  # phases in which its tasks must be stopped
IN_BATCH = ("draining", "switching", "starting")
MIN_READY = 5.0  # seconds a machine's tasks must run after its switch before it counts as done
DEFAULTS = {"max_unavailable": 1, "auto_rollback": True, "deadline": 300.0}


def doc_name(doc: dict | None) -> str | None:
    return doc.get("name") if doc else None


def doc_hash(doc: dict | None) -> str | None:
    return doc.get("hash") if doc else None


def label(doc: dict | None) -> str:
    """A profile document in words: its name and the start of its hash ("web@1a2b3c4d")."""
    if not doc or not doc.get("name"):
        return "(no profile)"
    return doc["name"] + (f"@{doc['hash'][:8]}" if doc.get("hash") else "")


def backwards(r: dict) -> bool:
    """Whether the rollout goes back to the old document: while it rolls back, once it rolled
    back, and while a rollback is paused (a pause changes no machine's document)."""
    return r["state"] in ("rolling_back", "rolled_back") or \
        (r["state"] == "paused" and r.get("paused_from") == "rolling_back")


def target(r: dict) -> dict | None:
    """Where the rollout goes: the new document, or the old one while (and once) it rolls back."""
    return r["from"] if backwards(r) else r["to"]


def source(r: dict) -> dict | None:
    return r["to"] if backwards(r) else r["from"]


def holds_source(m: dict) -> bool:
    """Whether a machine of the rollout still holds the source: pending or draining, unless it was
    switched before (a failed machine an operator's resume drains again: `on_target`; it is not
    switched back under its running tasks)."""
    return m["phase"] in HOLDS_OLD and not m.get("on_target")


def machine_doc(r: dict, mid: str) -> dict | None:
    """The document machine `mid` of the entitlement should hold now: a machine the rollout has
    not switched yet keeps the source; one switched, or one that joined the entitlement meanwhile
    (from the free pool), gets the target."""
    if r["state"] in ACTIVE:
        m = r["machines"].get(mid)
        if m is not None and holds_source(m):
            return source(r)
    return target(r)


def stopping(r: object) -> list[str]:
    """The machines an active rollout record has draining or switching (their tasks stopped: they
    take no new task); a record of another shape has none (read by every placement: never raises)."""
    if not isinstance(r, dict) or r.get("state") not in ACTIVE or not isinstance(r.get("machines"), dict):
        return []
    return [mid for mid, m in r["machines"].items() if isinstance(m, dict) and m.get("phase") in STOPPED]


def phase(r: dict | None, mid: str) -> str | None:
    """The machine's phase in an active rollout (None: not in one)."""
    if r is None or r["state"] not in ACTIVE:
        return None
    m = r["machines"].get(mid)
    return m["phase"] if m is not None else None


def policy(ent_policy: dict | None) -> dict:
    return {**DEFAULTS, **(ent_policy or {})}


def begin(entitlement: str, old: dict | None, new: dict | None, machines: list[str], pol: dict,
          now: float) -> dict[str, Any]:
    """A rollout of every machine of the entitlement from `old` to `new`."""
    return {
        "id": f"{entitlement}-{int(now * 1000)}", "entitlement": entitlement, "from": old, "to": new,
        "state": "rolling", "why": "", "policy": policy(pol),
        "machines": {mid: pending() for mid in sorted(machines)}, "batches": [], "rejected": None,
        "created": now, "updated": now,
    }


def baseline(entitlement: str, doc: dict | None, now: float) -> dict[str, Any]:
    """The record of an entitlement with no rollout yet: its machines hold `doc`."""
    r = begin(entitlement, None, doc, [], {}, now)
    r.update(state="done", id=f"{entitlement}-baseline")
    return r


def pending() -> dict:
    return {"phase": "pending", "batch": 0, "since": 0.0, "ready_since": None, "why": "", "tasks": []}


def summary(r: dict) -> dict:
    """Counts of the machines by phase, and the batch in progress, for answers and the CLI."""
    phases: dict[str, int] = {}
    for m in r["machines"].values():
        phases[m["phase"]] = phases.get(m["phase"], 0) + 1
    return {"id": r["id"], "state": r["state"], "from": label(r["from"]), "to": label(r["to"]), "why": r["why"],
            "machines": phases, "batches": len(r["batches"])}


def reprofile_of(r: dict | None, mid: str) -> Reprofile | None:
    """What the scheduler's reconciler knows of a machine in the rollout's batch (None: not in one)."""
    p = phase(r, mid)
    if p is None or p not in IN_BATCH:
        return None
    return Reprofile(r["id"], p, f"{label(source(r))} -> {label(target(r))}")
