"""Planned maintenance (the ops planner, paper 2.5): what an operator asks for made into an
unavailability event, and the calendar of the events that cover each machine.

An operator schedules a maintenance of some machines with a start, a duration and a deadline
(`twinectl maintenance schedule`). From then on its machines take no new tasks (the allocator
sees them cordoned); jobs hear of it in advance notices (notices.py) until its deadline, when the
tasks still on its machines are stopped; at its end the machines are back.
"""

from __future__ import annotations

import secrets

from controlplane.store.records import ApiError, EventRec, MachineRec

POLICIES = ("move", "stop")  # for jobs without a TaskController: move their tasks away first, or stop them at the deadline
MAX_DURATION = 30 * 86400.0  # seconds: a window longer than a month is a typo
MAX_AHEAD = 366 * 86400.0  # seconds: maintenance is scheduled at most a year ahead


def _time(value: float, field_: str, now: float) -> float:
    if value > now + MAX_AHEAD:
        raise ApiError("unprocessable", field_, f"{value!r} is more than a year ahead (seconds since the epoch, "
                       "not milliseconds?)")
    return float(value)


def parse_maintenance(d: dict, machines: dict[str, MachineRec], now: float) -> EventRec:
    """A maintenance the operator asks for (its shape checked: schema.MaintenanceSpec): the
    machines (listed, or every machine in a dc, msb or rack, the labels ANDed), a start, a
    duration, and a deadline at or before the start (default: the start). Names the field at
    fault; writes nothing."""
    listed = d.get("machines")
    labels = {k: d[k] for k in ("dc", "msb", "rack") if d.get(k) is not None}
    if listed is None and not labels:
        raise ApiError("unprocessable", "machines", "name the machines: a list of machine ids, or dc, msb or rack")
    if listed is not None:
        unknown = [m for m in listed if m not in machines]
        if unknown:
            raise ApiError("unprocessable", "machines", f"no such machine(s): {', '.join(unknown[:5])}")
    chosen = sorted(mid for mid, m in machines.items() if (listed is None or mid in listed)
                    and all(m.labels.get(k) == v for k, v in labels.items()))
    if not chosen:
        what = ", ".join(f"{k}={v}" for k, v in labels.items())
        raise ApiError("unprocessable", next(iter(labels)) if labels else "machines", f"no machine matches {what}")
    start, duration = _time(d["start"], "start", now), d["duration"]
    deadline = start if d.get("deadline") is None else _time(d["deadline"], "deadline", now)
    if deadline > start:
        raise ApiError("unprocessable", "deadline", "must be at or before the start: tasks leave before the work begins")
    if start + duration <= now:
        raise ApiError("unprocessable", "start", "the maintenance would be over already")
    policy, reason = d.get("policy"), d.get("reason", "")
    if labels:
        scope = " ".join(f"{k}={v}" for k, v in labels.items())
    else:
        scope = ", ".join(chosen) if len(chosen) <= 3 else f"{len(chosen)} machines"
    eid = f"maint-{int(now)}-{secrets.token_hex(3)}"
    return EventRec(eid, "maintenance", tuple(chosen), start, reason, float(duration), deadline, None,
                    scope, policy, now)


class Calendar:
    """The maintenance events of the region, by machine: which one governs a machine now, which
    ended lately, which are not over. Rebuilt from the events when one of them changes (a
    maintenance is scheduled or ended: rare); read on every pass over a job's machines."""

    def __init__(self) -> None:
        self._by_machine: dict[str, list[EventRec]] = {}

    def index(self, events) -> None:
        by_machine: dict[str, list[EventRec]] = {}
        for e in events:
            if e.kind == "maintenance":
                for mid in e.machines:
                    by_machine.setdefault(mid, []).append(e)
        self._by_machine = by_machine

    def machines(self):
        """The machines some maintenance (over or not) covers."""
        return self._by_machine.keys()

    def of(self, mid: str, now: float) -> EventRec | None:
        """The maintenance that governs a machine now: one in progress, else the next deadline."""
        open_ = [e for e in self._by_machine.get(mid, ()) if e.phase(now) != "over"]
        if not open_:
            return None
        return min(open_, key=lambda e: (e.phase(now) != "in progress", e.due, e.id))

    def just_over(self, mid: str, now: float, grace: float) -> EventRec | None:
        """The machine's latest maintenance that ended less than `grace` seconds ago."""
        recent = [e for e in self._by_machine.get(mid, ()) if e.until <= now < e.until + grace]
        return max(recent, key=lambda e: (e.until, e.id)) if recent else None

    def open(self, now: float) -> list[EventRec]:
        """Every maintenance not over, by deadline."""
        return sorted({e.id: e for es in self._by_machine.values() for e in es if e.phase(now) != "over"}.values(),
                      key=lambda e: (e.due, e.id))
