"""`twinectl rebalance plan|apply|status|enable|disable` (issue #27): what the ReBalancer would do
(a dry run: each goal's score before and after, the plan in words, the moves), one round of it
(the moves requested of the jobs' shard leaders; --wait follows them to their end), what it is
doing, and its continuous mode."""

from __future__ import annotations

import asyncio
import time

from controlplane.cli.api import EXIT_OK, Api, entitlement_query
from controlplane.cli.output import Out
from controlplane.cli.render import table

EXIT_UNFINISHED = 3  # --wait ran out with moves still going


def plan_text(body: dict) -> str:
    out = list(body.get("summary") or []) or ["nothing to plan: no entitlement holds machines"]
    goals = body.get("goals") or {}
    rows = [[f"{goal}: {name.replace('_', ' ')}", _v(v.get("before")), _v(v.get("after"))]
            for goal, scores in goals.items() for name, v in scores.items()]
    if rows:
        out += ["", table(["GOAL", "BEFORE", "AFTER"], rows)]
    moves = body.get("moves") or []
    if moves:
        what = (f"requested in round {body['round']}: each moves once its job's TaskController acks" if "round" in body
                else "a dry run: nothing moved")
        asked = any("taskcontrol" in m for m in moves)  # a plan's: each job's TaskController asked in a dry run
        out += ["", f"MOVES ({len(moves)}; {what})",
                table(["TASK", "FROM", "TO", "WHY", *(["TASKCONTROL (dry run)"] if asked else [])],
                      [[f"{m['job']}#{m['index']}", m["source"], m["target"], m["why"],
                        *([m.get("taskcontrol", "")] if asked else [])] for m in moves])]
    if body.get("freed"):
        out += ["", "freed for the free pool: " + ", ".join(body["freed"])]
    for v in body.get("violations") or []:
        out.append(f"violation (a bug, please report it): {v}")
    return "\n".join(out)


def _v(x) -> object:
    return "-" if x is None else x


def status_text(body: dict) -> str:
    c = body.get("continuous") or {}
    mode = "on for every entitlement" if c.get("all") else \
        ("on for " + ", ".join(c["entitlements"]) if c.get("entitlements") else "off")
    out = [f"continuous mode: {mode}; {body.get('requested', 0)} move(s) requested, not begun; "
           f"{len(body.get('moving') or [])} moving now"]
    if body.get("moving"):
        out += ["", table(["TASK", "FROM", "TO", "FOR", "WHY"],
                          [[f"{m['job']}#{m['index']}", m["source"], m["target"], f"{time.time() - m['since']:.0f}s",
                            m["why"]] for m in body["moving"]])]
    if body.get("recent"):
        out += ["", "RECENT (newest first)", table(["TASK", "TO", "WHEN", "OUTCOME"], [
            [f"{r['job']}#{r['index']}", r.get("target") or "-", time.strftime("%H:%M:%S", time.localtime(r["at"])),
             r.get("outcome", "")] for r in body["recent"]])]
    return "\n".join(out)


def _query(args) -> dict[str, str] | None:
    """--entitlement and --max-moves as the plan's query (the API says what is wrong with a value)."""
    params = dict(entitlement_query(args) or {})
    if getattr(args, "max_moves", None) is not None:
        params["max_moves"] = str(args.max_moves)
    return params or None


async def rebalance_plan(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/rebalance/plan", params=_query(args)), plan_text)
    return EXIT_OK


async def rebalance_apply(api: Api, args, out: Out) -> int:
    params = _query(args)
    began = time.time()
    body = await api.call("POST", "/v1/rebalance/apply", params=params)
    out(body, plan_text)
    if args.wait is None or not body.get("moves"):
        return EXIT_OK
    asked = {(m["job"], m["index"]) for m in body["moves"]}
    deadline = time.monotonic() + args.wait
    last = ""
    while True:
        st = await api.call("GET", "/v1/rebalance")
        ended = {(r["job"], r["index"]): r["outcome"] for r in st.get("recent") or []
                 if r.get("at", 0) >= began - 1 and r.get("outcome") != "moving"}
        moving = sum(1 for m in st.get("moving") or [] if (m["job"], m["index"]) in asked)
        done = sum(1 for k in asked if k in ended)
        line = f"{done} of {len(asked)} move(s) ended ({sum(1 for k in asked if ended.get(k) == 'done')} done), " \
               f"{moving} moving"
        if line != last and not getattr(args, "json", False):
            print(line, flush=True)
            last = line
        if done == len(asked):
            return EXIT_OK
        if time.monotonic() >= deadline:
            return EXIT_UNFINISHED
        await asyncio.sleep(1.0)


async def rebalance_status(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/rebalance"), status_text)
    return EXIT_OK


async def rebalance_switch(api: Api, args, out: Out) -> int:
    body = {"entitlement": args.entitlement} if args.entitlement else {}
    out(await api.call("POST", f"/v1/rebalance/{args.action}", body), status_text)
    return EXIT_OK
