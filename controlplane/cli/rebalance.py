"""`twinectl rebalance plan [--entitlement E]` (issue #27, its first step): what the ReBalancer
would do, as a dry run: each goal's score before and after, the plan in words, and the moves."""

from __future__ import annotations

from controlplane.cli.api import EXIT_OK, Api
from controlplane.cli.output import Out
from controlplane.cli.render import table


def plan_text(body: dict) -> str:
    out = list(body.get("summary") or []) or ["nothing to plan: no entitlement holds machines"]
    goals = body.get("goals") or {}
    rows = [[f"{goal}: {name.replace('_', ' ')}", v.get("before"), v.get("after")]
            for goal, scores in goals.items() for name, v in scores.items()]
    if rows:
        out += ["", table(["GOAL", "BEFORE", "AFTER"], rows)]
    moves = body.get("moves") or []
    if moves:
        out += ["", f"MOVES ({len(moves)}; a dry run: nothing moved)",
                table(["TASK", "FROM", "TO", "WHY"], [[f"{m['job']}#{m['index']}", m["source"], m["target"], m["why"]]
                                                     for m in moves])]
    if body.get("freed"):
        out += ["", "freed for the free pool: " + ", ".join(body["freed"])]
    return "\n".join(out)


async def rebalance_plan(api: Api, args, out: Out) -> int:
    params = {"entitlement": args.entitlement} if args.entitlement else None
    out(await api.call("GET", "/v1/rebalance/plan", params=params), plan_text)
    return EXIT_OK
