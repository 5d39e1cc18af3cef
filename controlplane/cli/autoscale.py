"""`twinectl job autoscale HANDLE` (issue #26): what the SRM does with a job: its size and the
recommendation, why, what it measured, and its last resizes."""

from __future__ import annotations

import time

from controlplane.cli.api import EXIT_OK, Api, split_handle
from controlplane.cli.output import Out
from controlplane.cli.render import key_values, table


def _when(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _n(v) -> str:
    return "-" if v is None else str(v)


def _age(m: dict) -> str:
    return f", {m['age']:g}s old" if m.get("age") else ""


def autoscale_text(body: dict) -> str:
    p = body.get("policy")
    if p is None:
        return key_values([("job", body.get("job")), ("size", body.get("size")), ("autoscale", body.get("reason"))])
    metric = p.get("metric")
    load = (f"cpu at {p['target_cpu']} of each task's cpus" if metric is None else
            f"{'prometheus ' + repr(metric['prometheus']) if metric.get('prometheus') else 'GET ' + metric['http']}"
            f" at {metric['target']:g} a task")
    m = body.get("measured") or {}
    pairs = [("job", body.get("job")),
             ("policy", f"{p['min']} to {p['max']} tasks; {load}; tolerance {p['tolerance']}; "
                        f"{'predictive' if p['predictive'] else 'reactive only'}; scale down after "
                        f"{p['scale_down_after']:g}s; at most {p['max_changes_per_hour']} changes an hour"),
             ("size", body.get("size")),
             ("recommended", f"{_n(body.get('recommended'))} (reactive {_n(body.get('reactive'))}, predictive "
                             f"{_n(body.get('predictive'))})"),
             ("reason", body.get("reason"))]
    if body.get("clamped"):
        pairs.append(("clamped", body["clamped"]))
    pairs += [("measured", "nothing" if m.get("load") is None else
               f"{m['load']:g} ({m['running']} running, {m['per_task']:g} a task at target"
               f"{_age(m)})"),
              ("forecast peak", "not used (predictive: false)" if not p["predictive"] else
               "none (no history for this time)" if body.get("forecast") is None else
               f"{body['forecast']:g} cores (its rises trusted {body.get('forecast_trust', 1.0):.0%})"),
              ("start-up", f"{body.get('startup_seconds')}s"), ("flap budget left", body.get("budget_left"))]
    events = body.get("events") or []
    out = key_values(pairs)
    if events:
        out += "\n\nRESIZES\n" + table(["AT", "FROM", "TO", "REASON"],
                                      [[_when(e["at"]), e["was"], e["to"], e["reason"] +
                                        (f" (stopping {e['stopped']})" if e.get("stopped") else "")] for e in events])
    return out


async def job_autoscale(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/jobs/{split_handle(args.handle)}/autoscale"), autoscale_text)
    return EXIT_OK
