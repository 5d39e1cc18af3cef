"""Opportunistic capacity's SLO (issue #37): how many machines opportunistic work can count on,
hour by hour for the next day, with a stated probability, and how well the region kept what it
offered.

The pool is counted per group, "<machine type>/<dc>": of its healthy machines in no maintenance,
those no guaranteed entitlement holds and no reclaim is taking (free, or an opportunistic
entitlement's) are *available* to opportunistic work. A group's figure for an hour is the least
seen in it (a machine available for part of an hour was not available for the whole of it).

The forecast for the hour `l` hours ahead (l = 1..24) is the day before's figure for that hour,
moved by how far today is from the day before now (the daily shape, at today's level):

    F_l(now + l) = A(now + l - 24 h) + (A(now) - A(now - 24 h))

and without a day before, what is available now (persistence). Its error, e = A - F, is measured
on the history itself, lead by lead: every past hour t whose inputs are kept gives one error for
each lead. The line offered with probability p is F + the (1 - p) quantile of the errors for that
lead (nearest rank, lower), within [0, the group's machines]. With fewer errors than the quantile
needs (100 for 99 %, 1,000 for 99.9 %) the line is the worst error seen, and the answer says how
many there are: it is then an estimate, not a measured probability.

A group's *failure-domain buffer* is what losing one MSB would take from the pool for the
guaranteed tasks to run again: the guaranteed machines of its largest MSB,

    B(type, dc) = max over MSBs m of the dc of  sum over guaranteed entitlements e of g(e, type, m)

(an entitlement spread over N MSBs, evenly, loses 1/N of its machines with one of them; the sum
over entitlements of machines(e)/N bounds B from above, and B is what the machines' places say).
The buffer is not kept idle: it is lent to opportunistic work like the rest of the pool, and on an
MSB's loss the failed tasks' replacements take it (free machines first, then opportunistic ones
reclaimed without notice). It is lent without a promise: the line offered is the 99 % line less
the buffer, so what an MSB's loss takes for the replacements was never offered. The lost MSB's
own free and opportunistic machines go down with it too; that part is left to the 99 % line
(deducting it would take about an MSB's share of the dc off every hour's offer).

The SLO offered is that line. Each hour's record keeps the line offered for the 24 hours after
it; an hour is judged against the offer made for it earliest (up to 24 h ahead): delivered when
what was available in it is at least what was offered.

The SRM's own forecasts are not yet folded in: the pool's history carries the daily shape the
SRM's sizes follow, not a growth the SRM foresees and the pool has not seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from controlplane.store.cells import HEALTHY

HOURS_KEPT = 8 * 7 * 24  # hourly records kept (8 weeks, as usage's rollups)
LEADS = 24  # hours ahead the forecast covers
LEVELS = (0.99, 0.999)  # the probabilities of the lines; the SLO offered is the first
FIGURES = ("machines", "guaranteed", "opportunistic", "free", "reclaiming", "available", "buffer")


def group_of(labels: Mapping[str, str]) -> str:
    return f"{labels.get('machine_type', '')}/{labels.get('dc', '')}"


def of_group(group: str) -> tuple[str, str]:
    """A group's machine type and dc."""
    machine_type, _, dc = group.rpartition("/")
    return machine_type, dc


def pool(state, now: float) -> dict[str, dict[str, int]]:
    """The region's machines now, per group: machines (healthy, in no maintenance), guaranteed,
    opportunistic, free, reclaiming (in a reclaim still open), available (free beyond the region's
    reserve + opportunistic, not reclaiming: what opportunistic work can hold) and buffer (the
    guaranteed machines of its largest MSB). From the machines' sums kept as they change
    (store/cells.py), less the few machines in maintenance, and the few in a reclaim moved from
    available to reclaiming: a pass over the cells, not the machines."""
    kinds = {name: e.kind for name, e in state.entitlements.items()}
    out: dict[str, dict[str, int]] = {}
    per_msb: dict[tuple[str, str], int] = {}
    for (dc, msb, ent, _, mtype), r in state.cells.rows.items():
        _add(out, per_msb, f"{mtype}/{dc}", msb, _kind(kinds, ent), r[HEALTHY])
    for mid in state.maintenance.machines():
        m = state.machines.get(mid)
        if m is not None and m.healthy and state.maintenance.of(mid, now) is not None:
            _add(out, per_msb, group_of(m.labels), m.labels.get("msb", ""), _kind(kinds, m.entitlement), -1)
    for mid in state.reclaims:
        m = state.machines.get(mid)
        if (m is not None and m.healthy and kinds.get(m.entitlement or "") == "opportunistic"
                and state.maintenance.of(mid, now) is None):
            g = out[group_of(m.labels)]
            g["reclaiming"] += 1
            g["available"] -= 1
    for g in out.values():
        g["available"] -= min(state.reserve, g["free"])
    for (group, _), n in per_msb.items():
        out[group]["buffer"] = max(out[group]["buffer"], n)
    return out


def _kind(kinds: dict[str, str], ent: str | None) -> str:
    """free (no entitlement), opportunistic, or guaranteed (any other)."""
    return "free" if not ent else "opportunistic" if kinds.get(ent) == "opportunistic" else "guaranteed"


def _add(out: dict[str, dict[str, int]], per_msb: dict[tuple[str, str], int], group: str, msb: str, kind: str,
         n: int) -> None:
    """n healthy machines of an entitlement of that kind ("free": none) in the group's msb."""
    g = out.setdefault(group, dict.fromkeys(FIGURES, 0))
    g["machines"] += n
    g[kind] += n
    if kind == "guaranteed":
        per_msb[(group, msb)] = per_msb.get((group, msb), 0) + n
    else:
        g["available"] += n


@dataclass
class History:
    """Hourly records: hour (since the epoch) -> group -> figures ("available" the hour's least,
    "machines" its most), and hour -> group -> the lines offered for the LEADS hours after it."""

    hours: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    offered: dict[int, dict[str, list[int | None]]] = field(default_factory=dict)

    def available(self, hour: int, group: str) -> int | None:
        return self.figure(hour, group, "available")

    def figure(self, hour: int, group: str, name: str) -> int | None:
        figures = self.hours.get(hour, {}).get(group)
        return None if figures is None else figures.get(name)

    def groups(self) -> set[str]:
        return {g for rec in self.hours.values() for g in rec}

    def put(self, hour: int, record: dict) -> None:
        self.hours[hour] = {g: dict(v) for g, v in record.get("groups", {}).items()}
        if record.get("offered"):
            self.offered[hour] = {g: list(v) for g, v in record["offered"].items()}

    def record(self, hour: int) -> dict:
        """The hour's record as etcd keeps it (put() reads it back)."""
        return {"groups": self.hours.get(hour, {}), "offered": self.offered.get(hour, {})}


def quantile(errors: list[int], p: float) -> int:
    """The (1 - p) quantile of the errors, nearest rank from below: with n errors, the k-th least
    for k = floor((1 - p) n) (at least the least)."""
    s = sorted(errors)
    return s[max(0, math.floor((1 - p) * len(s)) - 1)]


def _predict(h: History, group: str, at: int, lead: int, now_value: int | None) -> tuple[int | None, str]:
    """The forecast for hour `at` made `lead` hours before it, in the hour `at - lead` (now_value:
    what is available then; None: the history's figure for that hour)."""
    base_hour = at - lead

    def value(t: int) -> int | None:
        return now_value if t == base_hour and now_value is not None else h.available(t, group)

    base = value(base_hour)
    if base is None:
        return None, ""
    if lead == 24:  # the day before's figure is the one now
        return base, "daily"
    day_at, day_base = value(at - 24), value(base_hour - 24)
    if day_at is not None and day_base is not None:
        return day_at + base - day_base, "daily"
    return base, "persistence"


def errors(h: History, group: str, lead: int, method: str) -> list[int]:
    """The forecast's errors (available - forecast) over the history, for one lead and method."""
    out = []
    for t in sorted(h.hours):
        actual = h.available(t, group)
        if actual is None:
            continue
        f, how = _predict(h, group, t, lead, None)
        if f is not None and how == method:
            out.append(actual - f)
    return out


def forecast(h: History, now_pool: Mapping[str, Mapping[str, int]], hour: int,
             groups: set[str] | None = None) -> dict[str, list[dict]]:
    """Per group, the LEADS hours after `hour` (the hour now): what is expected available, the
    lines available with each of LEVELS' probability (None: no history to say it from), the
    group's failure-domain buffer now and the line offered (the first level's, less the buffer).
    About 50 ms a group with 8 weeks of history: callers on the event loop run it in a thread."""
    out: dict[str, list[dict]] = {}
    for group in sorted(groups if groups is not None else set(now_pool) | h.groups()):
        now = now_pool.get(group, {})
        avail, machines = now.get("available"), now.get("machines", 0)
        if avail is None:
            avail = h.available(hour - 1, group)
        buffer = now.get("buffer")
        if buffer is None:
            buffer = h.figure(hour - 1, group, "buffer") or 0
        rows = []
        for lead in range(1, LEADS + 1):
            at = hour + lead
            f, method = _predict(h, group, at, lead, avail) if avail is not None else (None, "")
            shown = None if f is None else min(machines, max(0, f))
            row: dict = {"hour": at * 3600, "lead": lead, "expected": shown, "method": method or None, "samples": 0}
            errs = errors(h, group, lead, method) if f is not None else []
            row["samples"] = len(errs)
            for p in LEVELS:
                key = f"p{str(p)[2:]}"  # p99, p999
                row[key] = None if not errs else min(machines, max(0, f + quantile(errs, p)))
                row[f"{key}_measured"] = bool(errs) and len(errs) * (1 - p) >= 1
            row["buffer"] = buffer
            row["offered"] = None if row["p99"] is None else max(0, row["p99"] - buffer)
            rows.append(row)
        out[group] = rows
    return out


def offer(fc: Mapping[str, list[dict]]) -> dict[str, list[int | None]]:
    """What is offered (the 99 % line less the buffer), per group, for the LEADS hours ahead."""
    return {g: [r["offered"] for r in rows] for g, rows in fc.items()}


def judged(h: History, group: str) -> list[tuple[int, int, int, int]]:
    """Every kept hour with an offer for it: (hour, offered, available, lead of the offer),
    against the offer made earliest (the longest lead)."""
    out = []
    for t in sorted(h.hours):
        actual = h.available(t, group)
        if actual is None:
            continue
        for lead in range(LEADS, 0, -1):
            line = h.offered.get(t - lead, {}).get(group)
            if line is not None and len(line) >= lead and line[lead - 1] is not None:
                out.append((t, line[lead - 1], actual, lead))
                break
    return out


def delivered(h: History, groups: set[str] | None = None) -> dict[str, dict]:
    """Per group: hours judged, hours delivered (available >= offered), their ratio (None before
    the first), and the hours missed with what was offered and available."""
    out = {}
    for group in sorted(groups if groups is not None else h.groups()):
        rows = judged(h, group)
        ok = sum(1 for _, o, a, _ in rows if a >= o)
        out[group] = {"judged": len(rows), "delivered": ok, "ratio": ok / len(rows) if rows else None,
                      "missed": [{"hour": t * 3600, "offered": o, "available": a, "lead": lead}
                                 for t, o, a, lead in rows if a < o][-20:]}
    return out
