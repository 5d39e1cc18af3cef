"""`twinectl capacity [status]|pause|resume` (issue #37): the reclaims of opportunistic machines
open and the last ones over; pause stops new reclaims (those begun go on), resume lets them begin."""

from __future__ import annotations

from controlplane.cli.api import EXIT_OK, Api
from controlplane.cli.output import Out
from controlplane.cli.render import table, when

HEADERS = ("RECLAIM", "FROM", "FOR", "CAUSE", "MACHINES", "LEFT", "PHASE", "DEADLINE")


def _row(r: dict) -> list:
    return [r["id"], r["entitlement"], r["heir"], r["cause"], len(r["machines"]), r["left"], r["phase"], when(r["deadline"])]


def status_text(body: dict) -> str:
    lines = [f"reclaims: {'paused (twinectl capacity resume)' if body.get('paused') else 'on'}"]
    if body.get("open"):
        lines += ["", "open:", table(HEADERS, (_row(r) for r in body["open"]))]
    else:
        lines.append("open: none")
    if body.get("recent"):
        lines += ["", "recent:", table(HEADERS, (_row(r) for r in body["recent"]))]
    return "\n".join(lines)


async def capacity(api: Api, args, out: Out) -> int:
    verb = getattr(args, "action", None) or "status"
    if verb == "status":
        out(await api.call("GET", "/v1/capacity"), status_text)
    else:
        out(await api.call("POST", f"/v1/capacity/{verb}", {}), status_text)
    return EXIT_OK
