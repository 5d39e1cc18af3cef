"""twinectl's commands: each builds its request from its arguments, calls the daemon, prints the
answer (output.py), and returns an exit code."""

from __future__ import annotations

import argparse
import string
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.cli import autoscale, capacity, rebalance, render, rollout, usage
from controlplane.cli.api import EXIT_INPUT, EXIT_OK, Api, CliError, entitlement_query, quoted, split_handle
from controlplane.cli.output import Out
from controlplane.cli.values import nullable
from controlplane.cli.wait import rollout_progress, show_or_wait, stop_progress

DEFAULT_SPREAD = ["dc", "msb"]  # the daemon's default spread, sent when only --pin-dc is given
Command = Callable[[Api, argparse.Namespace, Out], Awaitable[int]]


def _one_call(method: str, path: str, shown: Callable[[Any], str]) -> Command:
    """A command that is one API call, its answer shown: `path`'s {id} and {name} are those
    arguments, quoted for a URL; {handle} is a job handle's two parts."""
    names = [f for _, f, _, _ in string.Formatter().parse(path) if f]

    async def command(api: Api, args, out: Out) -> int:
        parts = {n: split_handle(getattr(args, n)) if n == "handle" else quoted(getattr(args, n)) for n in names}
        out(await api.call(method, path.format(**parts)), shown)
        return EXIT_OK

    return command


async def ent_create(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {"name": args.name, "machine_type": args.machine_type, "quota": args.quota}
    if args.profile is not None:
        body["profile"] = nullable(args.profile)
    if args.owner is not None:
        body["owner"] = args.owner
    if args.spread is not None or args.pin_dc is not None:
        body["spread"] = {"properties": DEFAULT_SPREAD if args.spread is None else args.spread, "pinned_dc": args.pin_dc}
    if args.allow_controller_network:
        body["allow_controller_networks"] = args.allow_controller_network
    if args.kind is not None:
        body["kind"] = args.kind
    if args.notice is not None:
        body["notice"] = args.notice
    if budget := reclaim_of(args):
        body["reclaim"] = budget
    if policy := rollout.policy_of(args):
        body["rollout"] = policy
    out(await api.call("POST", "/v1/entitlements", body), render.entitlement_show)
    return EXIT_OK


def reclaim_of(args) -> dict:
    """The --reclaim-* flags as the API's `reclaim` body (the fields given)."""
    given = (("max_machines", args.reclaim_max_machines), ("max_percent", args.reclaim_max_percent),
             ("cooldown", args.reclaim_cooldown))
    return {k: v for k, v in given if v is not None}


async def ent_modify(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {}
    if args.quota is not None:
        body["quota"] = args.quota
    if hasattr(args, "profile"):
        body["profile"] = args.profile
    if args.owner is not None:
        body["owner"] = args.owner
    if args.spread is not None or hasattr(args, "pin_dc"):
        if args.spread is not None and hasattr(args, "pin_dc"):
            body["spread"] = {"properties": args.spread, "pinned_dc": args.pin_dc}
        else:  # one half given: keep the other as the daemon has it
            spread = dict((await api.call("GET", f"/v1/entitlements/{quoted(args.name)}")).get("spread") or {})
            spread.setdefault("properties", DEFAULT_SPREAD)
            spread.setdefault("pinned_dc", None)
            if args.spread is not None:
                spread["properties"] = args.spread
            else:
                spread["pinned_dc"] = args.pin_dc
            body["spread"] = spread
    if args.allow_controller_network:
        body["allow_controller_networks"] = [n for n in args.allow_controller_network if nullable(n) is not None]
    if args.notice is not None:
        body["notice"] = args.notice
    if budget := reclaim_of(args):
        body["reclaim"] = budget
    if policy := rollout.policy_of(args):
        body["rollout"] = policy
    if not body:
        raise CliError(EXIT_INPUT, "entitlement modify: nothing to change; give --quota, --profile, --owner, --spread, "
                                   "--pin-dc, --allow-controller-network, --notice, a --reclaim-* or a rollout flag")
    before = None
    if args.wait is not None:
        shown = await api.call("GET", f"/v1/entitlements/{quoted(args.name)}")
        before = (shown.get("rollout_state") or {}).get("id")
    out(await api.call("PATCH", f"/v1/entitlements/{quoted(args.name)}", body), render.entitlement_show)
    if args.wait is not None:
        return await rollout.wait_rollout(api, args.name, before, args.wait, getattr(args, "json", False))
    return EXIT_OK


def _handle_of(job: Any, fallback: str) -> str:
    h = job.get("handle") if isinstance(job, dict) else None
    return h if isinstance(h, str) and h else fallback


async def job_run(api: Api, args, out: Out) -> int:
    spec = args.spec
    job = await api.call("POST", "/v1/jobs", spec)
    handle = _handle_of(job, f"{spec.get('entitlement')}/{spec.get('name')}")
    return await show_or_wait(api, args, out, job, handle, rollout_progress, "running")


async def job_update(api: Api, args, out: Out) -> int:
    if getattr(args, "dry_run", False):
        if args.wait is not None:
            raise CliError(EXIT_INPUT, "job update: --dry-run changes nothing, so there is nothing to --wait for")
        out(await api.call("POST", f"/v1/jobs/{split_handle(args.handle)}/dry-run", args.spec),
            lambda body: "\n".join(body["summary"]))
        return EXIT_OK
    job = await api.call("PUT", f"/v1/jobs/{split_handle(args.handle)}", args.spec)
    return await show_or_wait(api, args, out, job, _handle_of(job, args.handle), rollout_progress, "running")


async def job_list(api: Api, args, out: Out) -> int:
    params = entitlement_query(args)
    out(await api.call("GET", "/v1/jobs", params=params), render.job_list)
    return EXIT_OK


async def job_resize(api: Api, args, out: Out) -> int:
    job = await api.call("POST", f"/v1/jobs/{split_handle(args.handle)}/resize", {"count": args.count})
    return await show_or_wait(api, args, out, job, args.handle, rollout_progress, "running")


async def job_stop(api: Api, args, out: Out) -> int:
    job = await api.call("DELETE", f"/v1/jobs/{split_handle(args.handle)}")
    return await show_or_wait(api, args, out, job, args.handle, stop_progress, "stopped")


async def maintenance_schedule(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {"start": args.start, "duration": args.duration, "reason": args.reason}
    for k in ("dc", "msb", "rack", "deadline", "policy"):
        if getattr(args, k) is not None:
            body[k] = getattr(args, k)
    if args.machine:
        body["machines"] = args.machine
    if not (args.machine or args.dc or args.msb or args.rack):
        raise CliError(EXIT_INPUT, "name the machines: --machine ID (repeatable), --dc, --msb or --rack")
    if getattr(args, "dry_run", False):
        out(await api.call("POST", "/v1/dry-run/maintenance", body), lambda b: "\n".join(b["summary"]))
        return EXIT_OK
    out(await api.call("POST", "/v1/maintenance", body), render.maintenance_show)
    return EXIT_OK


async def maintenance_list(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/maintenance", params={"all": "1"} if args.all else None), render.maintenance_list)
    return EXIT_OK


async def ent_move(api: Api, args, out: Out) -> int:
    out(await api.call("POST", f"/v1/entitlements/{quoted(args.name)}/move", {"shard": args.shard}), render.entitlement_show)
    return EXIT_OK


async def token_create(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {"role": args.role, "entitlements": args.entitlement or [], "description": args.description}
    if args.expires is not None:
        body["expires_in"] = args.expires
    out(await api.call("POST", "/v1/tokens", body), render.token_created)
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Command] = {
    ("entitlement", "create"): ent_create,
    ("entitlement", "modify"): ent_modify,
    ("entitlement", "list"): _one_call("GET", "/v1/entitlements", render.entitlement_list),
    ("entitlement", "show"): _one_call("GET", "/v1/entitlements/{name}", render.entitlement_show),
    ("entitlement", "move"): ent_move,
    ("entitlement", "rollout"): rollout.rollout_cmd,
    ("cluster", None): _one_call("GET", "/v1/cluster", render.cluster),
    ("token", "create"): token_create,
    ("token", "list"): _one_call("GET", "/v1/tokens", render.token_list),
    ("token", "revoke"): _one_call("DELETE", "/v1/tokens/{id}", lambda b: f"token {b['revoked']} revoked"),
    ("job", "run"): job_run,
    ("job", "status"): _one_call("GET", "/v1/jobs/{handle}", render.job_status),
    ("job", "list"): job_list,
    ("job", "update"): job_update,
    ("job", "resize"): job_resize,
    ("job", "stop"): job_stop,
    ("machine", "list"): _one_call("GET", "/v1/machines", render.machine_list),
    ("machine", "show"): _one_call("GET", "/v1/machines/{id}", render.machine_show),
    ("machine", "release"): _one_call("POST", "/v1/machines/{id}/release", render.machine_show),
    ("machine", "clean"): _one_call("POST", "/v1/machines/{id}/clean", render.machine_show),
    ("maintenance", "schedule"): maintenance_schedule,
    ("maintenance", "list"): maintenance_list,
    ("maintenance", "show"): _one_call("GET", "/v1/maintenance/{id}", render.maintenance_show),
    ("maintenance", "end"): _one_call("POST", "/v1/maintenance/{id}/end", render.maintenance_show),
    ("events", None): _one_call("GET", "/v1/events", render.event_list),
    ("fleet", None): usage.fleet,
    ("job", "usage"): usage.job_usage,
    ("job", "autoscale"): autoscale.job_autoscale,
    ("rebalance", "plan"): rebalance.rebalance_plan,
    ("rebalance", "apply"): rebalance.rebalance_apply,
    ("rebalance", "status"): rebalance.rebalance_status,
    ("rebalance", "enable"): rebalance.rebalance_switch,
    ("rebalance", "disable"): rebalance.rebalance_switch,
    ("entitlement", "usage"): usage.entitlement_usage,
    ("discovery", None): _one_call("GET", "/v1/discovery/{handle}", render.discovery),
    ("capacity", None): capacity.capacity,
    ("capacity", "status"): capacity.capacity,
    ("capacity", "pause"): capacity.capacity,
    ("capacity", "resume"): capacity.capacity,
    ("capacity", "reserve"): capacity.capacity,
    ("capacity", "forecast"): capacity.forecast,
    ("capacity", "slo"): capacity.slo,
}
