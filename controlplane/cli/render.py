"""Readable text for twinectl: aligned plain-text tables of the daemon's JSON (docs/api.md).

Pure functions from JSON-shaped dicts to strings; missing fields show as "-" so a daemon that
adds or omits a field never breaks the output.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any

NONE = "-"


def cell(v: Any) -> str:
    if v is None or v == "" or v == []:
        return NONE
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(cell(x) for x in v)
    return " ".join(str(v).split())  # one line per row, whatever the daemon sends


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, two spaces apart; the last column is not padded."""
    body = [[cell(c) for c in row] for row in rows]
    lines = [list(headers)] + body
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    out = []
    for line in lines:
        padded = [c.ljust(w) for c, w in zip(line[:-1], widths)] + [line[-1]]
        out.append("  ".join(padded).rstrip())
    return "\n".join(out)


def when(v: Any) -> str:
    """A time: ISO strings as sent, epoch seconds as UTC."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
        t = datetime.datetime.fromtimestamp(v, datetime.UTC)
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")
    return cell(v)


def duration(v: Any) -> str:
    """Seconds as 45s, 10m, 1h30m, 2d3h; anything else as sent."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return cell(v)
    s = round(v)
    if s < 60:
        return f"{s}s"
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [(d, "d"), (h, "h"), (m, "m"), (s, "s")]
    return "".join(f"{n}{u}" for n, u in parts if n)


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _num(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:g}"
    return NONE


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in pairs) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {v if isinstance(v, str) else cell(v)}" for k, v in pairs)


# --- entitlements ---------------------------------------------------------------------------

ENTITLEMENT_HEADERS = ("NAME", "KIND", "TYPE", "QUOTA", "HELD", "PROFILE", "SPREAD", "PIN")


def entitlement_row(e: dict) -> list:
    return [e.get("name"), e.get("kind", "guaranteed"), e.get("machine_type"), e.get("quota"), e.get("held"),
            e.get("profile"), _get(e, "spread", "properties"), _get(e, "spread", "pinned_dc")]


def entitlement_list(body: dict) -> str:
    return table(ENTITLEMENT_HEADERS, (entitlement_row(e) for e in body.get("entitlements") or []))


def entitlement_show(e: dict) -> str:
    pairs = [
        ("entitlement", cell(e.get("name"))),
        ("kind", cell(e.get("kind", "guaranteed")) + (f" (machines taken back after {e['notice']:g} s of notice)"
                                                      if e.get("kind") == "opportunistic" else "")),
        *([("reclaims", "at most {max_machines} machines or {max_percent:g} % at once, {cooldown:g} s apart".format(
            **e["reclaim"]))] if e.get("kind") == "opportunistic" and e.get("reclaim") else []),
        ("owner", cell(e.get("owner"))),
        ("machine type", cell(e.get("machine_type"))),
        ("quota", f"{cell(e.get('held'))} of {cell(e.get('quota'))} machines held"),
        ("profile", cell(e.get("profile"))),
        ("spread", cell(_get(e, "spread", "properties"))),
        ("pinned dc", cell(_get(e, "spread", "pinned_dc"))),
        ("shard", cell(e.get("shard"))),
    ]
    if e.get("allow_controller_networks"):
        pairs.append(("controller networks", cell(e["allow_controller_networks"])))
    r = e.get("rollout_state")
    if r and not r["id"].endswith("-baseline"):  # its last profile rollout (twinectl entitlement rollout status)
        pairs.append(("profile rollout", f"{r['state'].replace('_', ' ')}: {r['from']} -> {r['to']}"
                      + (f" ({r['why']})" if r.get("why") else "")))
    for key in ("machines", "jobs"):  # only `show` carries them
        if isinstance(e.get(key), list):
            pairs.append((f"{key} ({len(e[key])})", cell(e[key])))
    return key_values(pairs)


# --- jobs -----------------------------------------------------------------------------------

TASK_HEADERS = ("INDEX", "STATE", "MACHINE", "DC", "MSB", "SPEC", "DISCOVERY", "REASON")
JOB_HEADERS = ("HANDLE", "STATE", "COUNT", "RUNNING", "PENDING", "SPEC", "UPDATED", "MESSAGE")


def summary_text(summary: Any) -> str:
    """`running=2 pending=1 ...`: running and pending first, then whatever else the daemon counts."""
    if not isinstance(summary, dict) or not summary:
        return NONE
    keys = [k for k in ("running", "pending") if k in summary] + sorted(k for k in summary if k not in ("running", "pending"))
    return " ".join(f"{k}={cell(summary[k])}" for k in keys)


def job_header(job: dict) -> str:
    line = (f"job {cell(job.get('handle'))}  state={cell(job.get('state'))}  count={cell(job.get('count'))}"
            f"  spec_version={cell(job.get('spec_version'))}  {summary_text(job.get('summary'))}")
    a = job.get("autoscale")
    if isinstance(a, dict):
        line += f"\nautoscale: {a.get('min')} to {a.get('max')} tasks (twinectl job autoscale {cell(job.get('handle'))})"
    for w in job.get("warnings") or []:
        line += f"\nwarning: {w}"
    if job.get("message"):
        line += f"\nmessage: {job['message']}"
    return line


def task_row(t: dict) -> list:
    return [t.get("index"), t.get("state"), t.get("machine"), _get(t, "where", "dc"), _get(t, "where", "msb"),
            t.get("spec_version"), t.get("discovery"), t.get("reason")]


def job_status(job: dict) -> str:
    """The header, then one row per task (ordered by index) when the job carries its tasks."""
    out = job_header(job)
    if "tasks" in job:
        tasks = sorted(job.get("tasks") or [], key=lambda t: (t.get("index") is None, t.get("index") or 0))
        out += "\n" + (table(TASK_HEADERS, (task_row(t) for t in tasks)) if tasks else "(no tasks)")
    return out + operations(job)


def operations(job: dict) -> str:
    """Disruptive operations: what waits and why, and the job's TaskController conversation."""
    ops = job.get("operations") or {}
    tc = job.get("taskcontrol")
    lines = []
    if tc:
        state = "ok" if tc.get("ok") else ("never called" if tc.get("ok") is None else f"FAILING: {tc.get('error')}")
        lines.append(f"taskcontroller: {tc.get('url')}  calls={tc.get('calls')}  {state}")
        for name in ("pending", "approved", "in_flight"):
            if tc.get(name):
                lines.append(f"  {name.replace('_', ' ')}: {', '.join(tc[name])}")
        done = [op for call in tc.get("recent_calls") or [] for op in call.get("completed") or []]
        if done:
            lines.append(f"  recently completed: {', '.join(done[-10:])}")
    for name in ("held", "waiting"):
        for item in ops.get(name) or []:
            lines.append(f"{name}: {item}")
    return ("\n" + "\n".join(lines)) if lines else ""


def job_list(body: dict) -> str:
    rows = []
    for j in body.get("jobs") or []:
        s = j.get("summary") or {}
        rows.append([j.get("handle"), j.get("state"), j.get("count"), s.get("running"), s.get("pending"),
                     j.get("spec_version"), when(j.get("updated_at")), j.get("message")])
    return table(JOB_HEADERS, rows)


# --- machines -------------------------------------------------------------------------------

MACHINE_HEADERS = ("ID", "HOSTNAME", "DC", "MSB", "RACK", "TYPE", "ENTITLEMENT", "HEALTHY", "PROFILE", "TASKS",
                   "CPU(used/total)", "MEM")


def profile_text(p: Any) -> str:
    """`web` when applied as desired; `db->web` while switching; `web(failed)` when not ok."""
    if not isinstance(p, dict):
        return cell(p)
    desired, applied, ok = p.get("desired"), p.get("applied"), p.get("ok")
    text = cell(applied) if desired == applied else f"{applied or 'none'}->{desired or 'none'}"
    return text + ("(failed)" if ok is False else "")


def used_total(used: Any, total: Any) -> str:
    return f"{_num(used)}/{_num(total)}"


def machine_row(m: dict) -> list:
    labels, cap, alloc = m.get("labels") or {}, m.get("capacity") or {}, m.get("alloc") or {}
    return [m.get("id"), m.get("hostname"), labels.get("dc"), labels.get("msb"), labels.get("rack"),
            labels.get("machine_type"), m.get("entitlement"), m.get("healthy"), profile_text(m.get("profile")),
            alloc.get("tasks"), used_total(alloc.get("cpus"), cap.get("cpus")),
            used_total(alloc.get("memory_mb"), cap.get("memory_mb"))]


def machine_list(body: dict) -> str:
    return table(MACHINE_HEADERS, (machine_row(m) for m in body.get("machines") or []))


MACHINE_TASK_HEADERS = ("JOB", "INDEX", "STATE", "SPEC", "DISCOVERY", "REASON")


def tombstones_row(graves: Any) -> list[tuple[str, str]]:
    """Tasks moved off the machine whose containers its agent has not reported gone (none: no row)."""
    if not isinstance(graves, list) or not graves:
        return []
    names = ", ".join(f"{t.get('job')}#{t.get('index')}" if isinstance(t, dict) else cell(t) for t in graves)
    return [("tombstones", f"{len(graves)}, moved away, their containers not yet reported gone: {names}")]


def machine_show(m: dict) -> str:
    labels, cap, alloc, agent = (m.get(k) or {} for k in ("labels", "capacity", "alloc", "agent"))
    healthy = cell(m.get("healthy"))
    if m.get("health_reason"):
        healthy += f" ({m['health_reason']})"
    supports = cap.get("supports")
    if isinstance(supports, dict):
        supports = sorted(k for k, v in supports.items() if v)
    out = key_values([
        ("machine", cell(m.get("id"))),
        ("hostname", cell(m.get("hostname"))),
        ("labels", " ".join(f"{k}={cell(labels.get(k))}" for k in ("region", "dc", "msb", "rack", "machine_type"))),
        ("entitlement", cell(m.get("entitlement"))),
        ("healthy", healthy),
        ("profile", profile_text(m.get("profile"))),
        ("cpus", f"{used_total(alloc.get('cpus'), cap.get('cpus'))} allocated"),
        ("memory MiB", f"{used_total(alloc.get('memory_mb'), cap.get('memory_mb'))} allocated"),
        ("disk GB", cell(cap.get("disk_gb"))),
        ("hugepages KiB", cell(cap.get("hugepage_sizes_kb"))),
        ("cgroup", cell(cap.get("cgroup_version"))),
        ("supports", cell(supports)),
        ("agent", f"{cell(agent.get('address'))} version {cell(agent.get('version'))}"),
        ("last heartbeat", when(m.get("last_heartbeat"))),
        *tombstones_row(m.get("tombstones")),
    ])
    tasks = m.get("tasks")
    if isinstance(tasks, list):
        rows = [[t.get("job"), t.get("index"), t.get("state"), t.get("spec_version"), t.get("discovery"), t.get("reason")]
                if isinstance(t, dict) else [t, None, None, None, None, None] for t in tasks]
        out += "\n" + (table(MACHINE_TASK_HEADERS, rows) if rows else "(no tasks)")
    return out


# --- events, discovery ----------------------------------------------------------------------

EVENT_HEADERS = ("ID", "KIND", "MACHINES", "START", "DURATION", "DEADLINE", "END", "REASON")


def machines_text(ms: Any, show: int = 3) -> str:
    if not isinstance(ms, list):
        return cell(ms)
    text = ",".join(str(m) for m in ms[:show])
    return text + (f",+{len(ms) - show} more" if len(ms) > show else "") if ms else NONE


def event_list(body: dict) -> str:
    rows = [[e.get("id"), e.get("kind"), machines_text(e.get("machines")), when(e.get("start")), duration(e.get("duration")),
             when(e.get("deadline")), when(e.get("end")), e.get("reason")] for e in body.get("events") or []]
    return table(EVENT_HEADERS, rows)


MAINTENANCE_HEADERS = ("ID", "PHASE", "SCOPE", "MACHINES", "DEADLINE", "START", "UNTIL", "POLICY", "TASKS", "REASON")


def maintenance_row(e: dict) -> list:
    policy = cell(e.get("policy")) + (" (default)" if e.get("policy_default") else "")
    return [e.get("id"), e.get("phase"), e.get("scope"), machines_text(e.get("machines")), when(e.get("deadline")),
            when(e.get("start")), when(e.get("until")), policy, len(e.get("tasks") or []), e.get("reason")]


def maintenance_list(body: dict) -> str:
    rows = [maintenance_row(e) for e in body.get("maintenance") or []]
    return table(MAINTENANCE_HEADERS, rows) if rows else "(no maintenance scheduled)"


def maintenance_show(e: dict) -> str:
    policy = cell(e.get("policy")) + (" (the region default)" if e.get("policy_default") else "")
    out = key_values([
        ("id", e.get("id")), ("phase", e.get("phase")), ("scope", e.get("scope")),
        ("machines", ", ".join(map(str, e.get("machines") or [])) or NONE),
        ("deadline", when(e.get("deadline"))), ("start", when(e.get("start"))),
        ("duration", duration(e.get("duration"))), ("until", when(e.get("until"))),
        ("policy", policy + " for jobs without a TaskController"), ("reason", e.get("reason") or NONE),
    ])
    rows = [[t.get("job"), t.get("index"), t.get("machine"), t.get("state")] for t in e.get("tasks") or []]
    return out + "\n" + (table(("JOB", "INDEX", "MACHINE", "STATE"), rows) if rows else "(no tasks on its machines)")


DISCOVERY_HEADERS = ("INDEX", "MACHINE", "ADDRESS", "ENABLED")


def discovery(body: dict) -> str:
    eps = sorted(body.get("endpoints") or [], key=lambda e: (e.get("index") is None, e.get("index") or 0))
    rows = [[e.get("index"), e.get("machine"), e.get("address"), e.get("enabled")] for e in eps]
    return f"job {cell(body.get('job'))}\n" + (table(DISCOVERY_HEADERS, rows) if rows else "(no endpoints)")


def cluster(body: dict) -> str:
    members = table(["MEMBER", "URL", "ROLES", "SHARDS"],
                    [[m["id"], m["url"], ",".join(m.get("roles", [])), _ranges(m.get("shards", []))]
                     for m in body["members"]])
    leaders = {s["leader"] for s in body["shards"]}
    shards = table(["SHARD", "LEADER", "EPOCH", "TASKS", "ENTITLEMENTS"],
                   [[s["shard"], s["leader"] or "(none: election under way)", cell(s["epoch"]), s["tasks"],
                     ", ".join(s["entitlements"]) or "-"] for s in body["shards"]])
    me = body.get("self") or {}
    head = f"region {body['region']}: {len(body['members'])} member(s), {len(body['shards'])} shard(s), " \
           f"{len(leaders - {None})} leader(s); this answer from member {me.get('member', '?')}"
    return "\n\n".join([head, members, shards])


def _ranges(shards: list[int]) -> str:
    out, run = [], []
    for s in sorted(shards) + [None]:
        if run and (s is None or s != run[-1] + 1):
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        if s is not None:
            run.append(s)
    return ",".join(out) or "-"


def token_created(body: dict) -> str:
    return (f"token {body['id']} ({body['role']}{' of ' + ', '.join(body['entitlements']) if body['entitlements'] else ''}"
            f", expires {when(body['expires']) if body['expires'] else 'never'}):\n{body['token']}\n"
            "(shown this once: the control plane keeps only its hash)")


def token_list(body: dict) -> str:
    return table(["ID", "ROLE", "ENTITLEMENTS", "EXPIRES", "CREATED", "DESCRIPTION"],
                 [[t["id"], t["role"], ", ".join(t["entitlements"]) or "-", when(t["expires"]) if t["expires"] else "never",
                   when(t["created_at"]), t["description"] or "-"] for t in body["tokens"]])
