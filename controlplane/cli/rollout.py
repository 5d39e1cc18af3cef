"""`twinectl entitlement rollout status|pause|resume|rollback NAME`, and `entitlement modify NAME
--profile P --wait [S]`, which follows the rollout the change starts (issue #28): a line each time
its progress changes, as `job update --wait` does for a job."""

from __future__ import annotations

import asyncio
import time

from controlplane.cli.api import EXIT_OK, Api, quoted
from controlplane.cli.output import Out
from controlplane.cli.render import table

EXIT_FAILED = 1  # rolled back, paused, or --wait ran out of time
NEW_ROLLOUT_WITHIN = 10.0  # seconds the shard leader takes at most to begin the rollout a change starts


def rollout_text(r: dict) -> str:
    out = [f"rollout {r['id']} of {r['entitlement']}: {r['state'].replace('_', ' ')}, {r['from']} -> {r['to']}"
           + (f" ({r['why']})" if r.get("why") else ""),
           f"policy: {r['policy']['max_unavailable']} machine(s) at a time, auto_rollback "
           f"{'on' if r['policy']['auto_rollback'] else 'off'}, deadline {r['policy']['deadline']:g} s"]
    if r.get("machines"):
        out += ["", table(["MACHINE", "MSB", "PHASE", "BATCH", "HOLDS", "WANTS", "WHY"],
                          [[m["id"], m["msb"] or "-", m["phase"] or "-", m["batch"] or "-", m["holds"], m["wants"],
                            m["why"]] for m in r["machines"]])]
    if r.get("batches"):
        out += ["", table(["BATCH", "MACHINES", "BEGAN", "OUTCOME", "WHY"], [
            [("back " if b.get("back") else "") + str(b["n"]), ", ".join(b["machines"]), _clock(b["began"]),
             b["outcome"] or "in progress", b["why"]] for b in r["batches"]])]
    return "\n".join(out)


def progress(r: dict) -> str:
    """One line of a rollout's progress."""
    phases: dict[str, int] = {}
    for m in r.get("machines") or []:
        if m["phase"]:
            phases[m["phase"]] = phases.get(m["phase"], 0) + 1
    b = (r.get("batches") or [None])[-1]
    batch = f"; batch {b['n']}{' (back)' if b.get('back') else ''}: {', '.join(b['machines'])} " \
            f"{b['outcome'] or 'in progress'}" if b else ""
    counts = ", ".join(f"{n} {p}" for p, n in sorted(phases.items())) or "no machine"
    return f"{r['state'].replace('_', ' ')}: {counts}{batch}" + (f" ({r['why']})" if r.get("why") else "")


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def policy_of(args) -> dict:
    """The rollout policy flags of `entitlement create|modify`, as the API's `rollout` body."""
    out: dict = {}
    if args.max_unavailable is not None:
        out["max_unavailable"] = args.max_unavailable
    if args.auto_rollback is not None:
        out["auto_rollback"] = args.auto_rollback == "on"
    if args.rollout_deadline is not None:
        out["deadline"] = args.rollout_deadline
    return out


async def rollout_cmd(api: Api, args, out: Out) -> int:
    path = f"/v1/entitlements/{quoted(args.name)}/rollout"
    if args.verb == "status":
        out(await api.call("GET", path), rollout_text)
    else:
        out(await api.call("POST", f"{path}/{args.verb}"), rollout_text)
    return EXIT_OK


async def wait_rollout(api: Api, name: str, before: str | None, seconds: float, quiet: bool) -> int:
    """Follow the rollout that a change of the entitlement begins (another id than `before`) to its
    end: 0 when it is done, 1 when it rolled back, paused or ran past `seconds`."""
    path = f"/v1/entitlements/{quoted(name)}/rollout"
    began, deadline, last = time.monotonic(), time.monotonic() + seconds, ""
    while True:
        r = await api.call("GET", path)
        if r["id"] == before and time.monotonic() - began > NEW_ROLLOUT_WITHIN:
            if not quiet:
                print(f"no rollout began: the machines already hold {r['to']}", flush=True)
            return EXIT_OK
        if r["id"] != before:
            line = progress(r)
            if line != last and not quiet:
                print(line, flush=True)
                last = line
            if r["state"] == "done":
                return EXIT_OK
            if r["state"] in ("rolled_back", "paused"):
                return EXIT_FAILED
        if time.monotonic() >= deadline:
            if not quiet:
                print(f"--wait: not over after {seconds:g} s (twinectl entitlement rollout status {name})", flush=True)
            return EXIT_FAILED
        await asyncio.sleep(1.0)
