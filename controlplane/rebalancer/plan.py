"""A rebalance plan (dry run): each group solved (compaction.py), the region's score before and
after, and each move with why, in words a person reads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from controlplane.rebalancer.compaction import TIME_LIMIT, Move, Result, solve
from controlplane.rebalancer.view import SCALE, Group


@dataclass(frozen=True)
class Plan:
    results: tuple[Result, ...]

    @property
    def moves(self) -> list[Move]:
        return [mv for r in self.results for mv in r.moves]

    def freed(self) -> list[str]:
        return sorted(mid for r in self.results for mid in r.freed)

    def to_json(self) -> dict:
        ents: dict[str, dict] = {}
        for r in self.results:
            g = r.group
            e = ents.setdefault(g.entitlement, {"held": 0, "held_after": 0, "cpus": 0, "cpus_after": 0, "reserved": 0})
            reserved = sum(t.cpus for t in g.tasks) + sum(m.fixed_cpus for m in g.machines)
            e["held"] += len(g.machines)
            e["held_after"] += len(r.kept)
            e["cpus"] += sum(m.cpus for m in g.machines)
            e["cpus_after"] += sum(m.cpus for m in g.machines if m.id in r.kept)
            e["reserved"] += reserved
        goals = {"compaction": {
            "machines_held": {"before": sum(e["held"] for e in ents.values()),
                              "after": sum(e["held_after"] for e in ents.values())},
            "stranded_cpus": {"before": round(sum(e["cpus"] - e["reserved"] for e in ents.values()) / SCALE, 3),
                              "after": round(sum(e["cpus_after"] - e["reserved"] for e in ents.values()) / SCALE, 3)}}}
        moves = []
        for r in self.results:
            for mv in r.moves:
                why = (f"compaction: frees {mv.source}" if mv.source in r.freed else
                       f"compaction: makes room on {mv.target} for tasks of a machine being freed")
                moves.append({"job": mv.job, "index": mv.index, "source": mv.source, "target": mv.target,
                              "goal": "compaction", "why": why})
        return {
            "goals": goals,
            "entitlements": {n: {"held": e["held"], "held_after": e["held_after"],
                                 "reserved_cpus": round(e["reserved"] / SCALE, 3),
                                 "cpus": round(e["cpus"] / SCALE, 3), "cpus_after": round(e["cpus_after"] / SCALE, 3)}
                             for n, e in sorted(ents.items())},
            "moves": moves,
            "freed": self.freed(),
            "groups": [{"entitlement": r.group.entitlement, "dc": r.group.dc, "msb": r.group.msb,
                        "machines": len(r.group.machines), "tasks": len(r.group.tasks), "status": r.status,
                        "seconds": round(r.seconds, 3)} for r in self.results],
            "summary": self.summary(ents),
        }

    def summary(self, ents: dict[str, dict]) -> list[str]:
        out = []
        for name, e in sorted(ents.items()):
            n = e["held"] - e["held_after"]
            moves = sum(len(r.moves) for r in self.results if r.group.entitlement == name)
            if n:
                out.append(f"entitlement {name} holds {e['held']} machines whose {e['cpus'] / SCALE:g} cores are "
                           f"{e['reserved'] / SCALE:g} reserved: moving {moves} task(s) within their MSBs frees "
                           f"{n} machine(s) for the free pool")
            else:
                out.append(f"entitlement {name} holds {e['held']} machines ({e['reserved'] / SCALE:g} of "
                           f"{e['cpus'] / SCALE:g} cores reserved): none can be freed by moves within an MSB")
        return out


TOTAL_LIMIT = 20.0  # seconds a plan's solving may take in all; the groups left are not solved


def plan(groups: list[Group], churn: float = 0.25, time_limit: float = TIME_LIMIT,
         total_limit: float = TOTAL_LIMIT) -> Plan:
    """Each group solved, largest first (where most is stranded), until total_limit is spent."""
    deadline = time.monotonic() + total_limit
    out = []
    for g in sorted(groups, key=lambda g: (-len(g.machines), g.entitlement, g.msb)):
        left = deadline - time.monotonic()
        if left <= 0.05:
            out.append(Result(g, tuple(sorted(m.id for m in g.machines)), (), (), "not solved: the plan's "
                              f"{total_limit:g} s were spent", 0.0))
            continue
        out.append(solve(g, churn, min(time_limit, left)))
    return Plan(tuple(sorted(out, key=lambda r: (r.group.entitlement, r.group.dc, r.group.msb))))
