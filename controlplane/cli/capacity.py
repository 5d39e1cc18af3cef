"""`twinectl capacity [status]|pause|resume|reserve N|forecast|slo` (issue #37): the reclaims of
opportunistic machines open and the last ones over; pause stops new reclaims (those begun go on),
resume lets them begin; reserve keeps N free machines per type and dc from opportunistic work;
the machines opportunistic work can count on for the next day (forecast) and how well the region
kept what it offered (slo)."""

from __future__ import annotations

from controlplane.cli.api import EXIT_OK, Api, entitlement_query
from controlplane.cli.output import Out
from controlplane.cli.render import table, when

HEADERS = ("RECLAIM", "FROM", "FOR", "CAUSE", "MACHINES", "LEFT", "PHASE", "DEADLINE")


def _row(r: dict) -> list:
    return [r["id"], r["entitlement"], r["heir"] or "(reserve)", r["cause"], len(r["machines"]), r["left"], r["phase"],
            when(r["deadline"])]


def status_text(body: dict) -> str:
    lines = [f"reclaims: {'paused (twinectl capacity resume)' if body.get('paused') else 'on'}",
             f"reserve: {body.get('reserve', 0)} free machine(s) per machine type and dc kept from opportunistic work"]
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
    elif verb == "reserve":
        out(await api.call("POST", "/v1/capacity/reserve", {"machines": args.machines}), status_text)
    else:
        out(await api.call("POST", f"/v1/capacity/{verb}", {}), status_text)
    return EXIT_OK


def _line(r: dict, key: str) -> str:
    if r[key] is None:
        return "-"
    return f"{r[key]}" if r[f"{key}_measured"] else f"{r[key]}~"


def _short(now: dict) -> str:
    short = now.get("buffer", 0) - now.get("available", 0)
    return (f"; {short} short: losing that MSB now would leave guaranteed tasks without a machine"
            if short > 0 else "")


def forecast_text(body: dict) -> str:
    lines = [f"history: {body['history_hours']} hour(s) kept; the SLO offered is the {body['offered_level']:.0%} line "
             "less the failure-domain buffer (~: an estimate, too few past errors to measure that probability)"]
    for g in body["groups"]:
        now = g["now"]
        lines += ["", f"{g['group']}: {now.get('available', 0)} of {now.get('machines', 0)} machine(s) available now "
                      f"({now.get('free', 0)} free, {now.get('opportunistic', 0)} opportunistic, "
                      f"{now.get('reclaiming', 0)} being reclaimed)",
                  f"  failure-domain buffer: {now.get('buffer', 0)} (the guaranteed machines of its largest MSB; "
                  "lent, not offered)" + _short(now),
                  table(("HOUR", "EXPECTED", "99%", "99.9%", "OFFERED", "METHOD", "ERRORS"),
                        ([when(r["hour"]), "-" if r["expected"] is None else r["expected"], _line(r, "p99"),
                          _line(r, "p999"), "-" if r.get("offered") is None else r["offered"], r["method"] or "-",
                          r["samples"]] for r in g["hours"]))]
    if not body["groups"]:
        lines.append("no machines")
    return "\n".join(lines)


def slo_text(body: dict) -> str:
    lines = [f"objective: the {body['objective']:.0%} line offered a day ahead, since {when(body['since'])}"]
    rows = [[g["group"], g["judged"], g["delivered"], "-" if g["ratio"] is None else f"{g['ratio']:.2%}"]
            for g in body["groups"]]
    lines.append(table(("GROUP", "HOURS JUDGED", "DELIVERED", "RATIO"), rows) if rows else "no hour judged yet")
    for g in body["groups"]:
        for m in g["missed"]:
            lines.append(f"  missed {g['group']} {when(m['hour'])}: {m['available']} available, {m['offered']} "
                         f"offered {m['lead']} h ahead")
    if body["reclaims"]:
        lines += ["", table(("CAUSE", "RECLAIMS", "MACHINES", "NOTICE S (LEAST/MEAN/MOST)", "OVER EARLY"),
                            ([c, v["reclaims"], v["machines"], "{least}/{mean}/{most}".format(**v["notice_s"]),
                              v["over_early"]] for c, v in sorted(body["reclaims"].items())))]
    else:
        lines += ["", "reclaims: none"]
    return "\n".join(lines)


async def forecast(api: Api, args, out: Out) -> int:
    params = entitlement_query(args)
    out(await api.call("GET", "/v1/capacity/forecast", params=params), forecast_text)
    return EXIT_OK


async def slo(api: Api, args, out: Out) -> int:
    params = entitlement_query(args)
    out(await api.call("GET", "/v1/capacity/slo", params=params), slo_text)
    return EXIT_OK
