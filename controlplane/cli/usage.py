"""twinectl's usage commands (issue #25): `twinectl fleet [--by ...]`, the region's machines summed
per cell as tables; `twinectl job usage HANDLE` and `twinectl entitlement usage NAME`, recent usage
against what is reserved, with a sparkline of the points; `--tasks`, a job's tasks one a row (#35)."""

from __future__ import annotations

from typing import Any

from controlplane.cli.api import EXIT_OK, Api, quoted, split_handle
from controlplane.cli.output import Out
from controlplane.cli.render import NONE, _num, key_values, table, when
from controlplane.cli.values import duration

BY = ("dc", "msb", "entitlement", "profile", "type")
BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], top: float) -> str:
    """One character a value, its height against `top` (the reservation, or the peak if higher)."""
    if not values:
        return NONE
    top = max(top, max(values)) or 1.0
    return "".join(BARS[min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))] for v in values)


def _pair(used: Any, of: Any) -> str:
    return f"{_num(used)}/{_num(of)}"


def fleet_text(body: dict) -> str:
    dims = body.get("by") or []
    heads = [d.upper() for d in dims] + ["MACHINES", "HEALTHY", "MAINT", "CPUS RES/USED/ALL", "MEM MiB RES/USED/ALL"]
    rows = []
    for c in body.get("cells") or []:
        name = [c.get(d) if c.get(d) or d != "entitlement" else "(free)" for d in dims]
        rows.append([*name, c["machines"], c["healthy"], c["maintenance"],
                     f"{_num(c['reserved']['cpus'])}/{_num(c['used']['cpus'])}/{_num(c['cpus'])}",
                     f"{c['reserved']['memory_mb']}/{c['used']['memory_mb']}/{c['memory_mb']}"])
    out = [table(heads, rows)]
    pool = body.get("free_pool") or []
    out += ["", "FREE POOL", table(["TYPE", "DC", "MACHINES", "USABLE"],
                                   [[p["type"], p["dc"], p["machines"], p["usable"]] for p in pool])]
    ents = body.get("entitlements") or {}
    out += ["", "ENTITLEMENTS", table(["NAME", "HELD/QUOTA", "LARGEST TASK (CPUS, MiB)", "ON HELD MACHINES"],
                                      [[n, f"{e['held']}/{e['quota']}",
                                        f"{_num(e['largest_task']['cpus'])}, {e['largest_task']['memory_mb']}",
                                        f"{_num(e['largest_on_held']['cpus'])}, {e['largest_on_held']['memory_mb']}"]
                                       for n, e in sorted(ents.items())])]
    return "\n".join(out)


def usage_text(body: dict) -> str:
    reserved, current = body.get("reserved") or {}, body.get("current")
    points = body.get("points") or []
    cpu = [p[1] for p in points]
    mem = [p[3] for p in points]
    name = body.get("job") or body.get("entitlement")
    pairs = [("usage of", name),
             ("cpus used/reserved", _pair(current["cpus"] if current else None, reserved.get("cpus"))),
             ("memory MiB used/reserved", _pair(current["memory_mb"] if current else None, reserved.get("memory_mb"))),
             ("tasks reporting", current["tasks_reporting"] if current else "none")]
    if points:
        pairs += [(f"cpus, {len(points)} × {body['step']}s", f"{sparkline(cpu, reserved.get('cpus') or 0)}  "
                   f"peak {_num(max(p[2] for p in points))}"),
                  ("memory MiB", f"{sparkline(mem, reserved.get('memory_mb') or 0)}  peak {max(p[4] for p in points)}")]
    else:
        pairs.append(("history", "no point yet in this window (a point a minute, kept by the shard's leader)"))
    text = key_values(pairs)
    tasks = body.get("tasks")
    if isinstance(tasks, list):  # asked for (--tasks)
        text += "\n\n" + (tasks_text(tasks) if tasks else "(no tasks)")
    return text


TASK_USAGE_HEADERS = ("INDEX", "MACHINE", "STATE", "CPUS", "MEM MiB", "MEASURED")


def tasks_text(tasks: list) -> str:
    """A job's tasks, one a row, as their agents last measured them ("-": not measured yet)."""
    rows = [[t["index"], t["machine"], t["state"], _num(t["cpus"]), _num(t["memory_mb"]), when(t["measured_at"])]
            for t in tasks]
    return table(TASK_USAGE_HEADERS, rows)


def _window(args) -> dict:
    return {k: str(round(v)) for k, v in (("since", args.since), ("step", args.step)) if v}


async def fleet(api: Api, args, out: Out) -> int:
    params = {"by": args.by} if args.by else None
    out(await api.call("GET", "/v1/fleet", params=params), fleet_text)
    return EXIT_OK


async def job_usage(api: Api, args, out: Out) -> int:
    params = {**_window(args), **({"tasks": "1"} if args.tasks else {})}
    out(await api.call("GET", f"/v1/jobs/{split_handle(args.handle)}/usage", params=params), usage_text)
    return EXIT_OK


async def entitlement_usage(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/entitlements/{quoted(args.name)}/usage", params=_window(args)), usage_text)
    return EXIT_OK


def window_options(parser) -> None:
    parser.add_argument("--since", type=duration, metavar="DUR", help="how far back (90m, 6h, 14d; default 1h)")
    parser.add_argument("--step", type=duration, metavar="DUR",
                        help="what one point covers (whole minutes; whole hours past 48h)")
