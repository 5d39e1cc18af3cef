"""twinectl: the operator's and job owner's command line for twine-controld (docs/api.md).

  twinectl entitlement create|modify|list|show ...
  twinectl job run|update FILE [--wait [S]]   job status|resize|stop HANDLE ...   job list
  twinectl machine list|show ID|release ID|clean ID     twinectl events     twinectl discovery HANDLE
  twinectl maintenance schedule (--machine ID ... | --dc DC | --msb MSB | --rack RACK) --start WHEN
           --duration DUR [--deadline WHEN] [--policy move|stop] [--reason TEXT]
  twinectl maintenance list [--all] | show ID | end ID
  twinectl token create --role admin|owner|reader|bootstrap [--entitlement E ...] [--expires DUR] | list | revoke ID

WHEN is +90s, +10m, +2h, now, seconds since the epoch, or a local ISO time (2026-11-21T14:00);
DUR is 90, 90s, 10m, 2h or 1d.

A HANDLE is <entitlement>/<job name>. Job spec files are YAML (.yaml, .yml) or TOML (.toml).
Global options go before or after the command; --json prints the daemon's JSON as it is.

Exit codes (scripts rely on them):
  0  done
  1  the daemon refused or failed (404, 409, 422, 5xx), or --wait ran out of time
  2  bad input: a spec file or argument (nothing was sent), or the daemon's 400
  3  the daemon is unreachable (or did not answer within --timeout)
  4  unauthorized: the daemon's 401/403 (a missing or wrong token)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import time
from datetime import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import aiohttp
import yarl

from agent import tls as tls_files
from agent.errors import InputError
from controlplane.cli import render
from controlplane.cli.specfile import SpecError, read_spec, spec_handle

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_UNREACHABLE, EXIT_UNAUTHORIZED = 0, 1, 2, 3, 4
PROG = "twinectl"
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 30.0
DEFAULT_WAIT = 300.0  # `--wait` without SECONDS
DEFAULT_SPREAD = ["dc", "msb"]  # the daemon's default spread, sent when only --pin-dc is given
POLL_INTERVAL = 1.0  # seconds between GETs while waiting


class CliError(Exception):
    """Ends the command with `twinectl: <message>` on stderr and `code`."""

    def __init__(self, code: int, message: str):
        self.code, self.message = code, message
        super().__init__(message)


def exit_code_for_status(status: int) -> int:
    """The exit code for a daemon's HTTP status (see the module docstring)."""
    if status < 400:
        return EXIT_OK
    if status == 400:
        return EXIT_INPUT
    if status in (401, 403):
        return EXIT_UNAUTHORIZED
    return EXIT_FAILED


def error_message(status: int, body: Any, text: str = "") -> str:
    """`<field>: <why>` (or `<why>`) from an error body {"error", "field", "why"}; for a body of
    another shape (a proxy's HTML page, say) the status and the start of the text."""
    if isinstance(body, dict) and body.get("why"):
        field = body.get("field")
        return f"{field}: {body['why']}" if field else str(body["why"])
    if isinstance(body, dict) and body.get("error"):
        return f"{body['error']} (HTTP {status})"
    snippet = " ".join(text.split())[:200]
    return f"HTTP {status}" + (f": {snippet}" if snippet else "")


class ApiError(CliError):
    """The daemon answered with an error status."""

    def __init__(self, status: int, body: Any, text: str = ""):
        self.status, self.body = status, body
        super().__init__(exit_code_for_status(status), error_message(status, body, text))


# --- HTTP -----------------------------------------------------------------------------------


class Api:
    """The daemon's REST API over one aiohttp session: `await api.call("GET", "/v1/jobs")`."""

    def __init__(self, url: str, token: str | None, timeout: float, tls: ssl.SSLContext | None = None):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout
        self.tls = tls  # how an https daemon is verified (None: the system's CAs)
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        headers = {"Accept": "application/json", "User-Agent": PROG}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self.session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout),
                                             connector=aiohttp.TCPConnector(ssl=self.tls or True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        assert self.session is not None
        where = f"twine-controld at {self.url}"
        try:
            async with self.session.request(method, self.url + path, json=body, params=params) as r:
                status, text = r.status, await r.text(errors="replace")
        except aiohttp.InvalidURL as e:
            raise CliError(EXIT_INPUT, f"--url: {self.url!r} is not a valid URL: {e}") from None
        except aiohttp.ClientConnectorCertificateError as e:
            raise CliError(EXIT_UNREACHABLE, f"cannot trust {where}: {e.certificate_error.verify_message or e} "
                                             "(give its CA with --ca or TWINE_CA)") from None
        except aiohttp.ClientConnectorSSLError as e:
            raise CliError(EXIT_UNREACHABLE, f"no TLS session with {where}: {e.os_error} "
                                             "(is it served over TLS? https:// needs --tls-cert on the daemon)") from None
        except aiohttp.ClientConnectorError as e:
            raise CliError(EXIT_UNREACHABLE, f"cannot reach {where}: {_os_reason(e.os_error)}") from None
        except TimeoutError:
            raise CliError(EXIT_UNREACHABLE, f"{where} did not answer within {self.timeout:g}s (--timeout)") from None
        except aiohttp.ClientError as e:
            raise CliError(EXIT_UNREACHABLE, f"lost the connection to {where}: {e or type(e).__name__}") from None
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = None
            if status < 400:
                raise CliError(EXIT_FAILED, f"{method} {path}: {where} answered HTTP {status} with no JSON: "
                                            f"{' '.join(text.split())[:200]}") from None
        if status >= 400:
            raise ApiError(status, data, text)
        return data


def _os_reason(e: OSError) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is twine-controld running? check --url / TWINE_URL)"
    return e.strerror or str(e) or type(e).__name__


# --- arguments ------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 seconds")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return v


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """`90`, `90s`, `10m`, `2h`, `1d` -> seconds (> 0)."""
    t = text.strip().lower()
    unit = UNITS.get(t[-1:], None)
    try:
        v = float(t[:-1] if unit else t) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m, 2h or 1d") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return v


_NOW: list[float] = []


def _now() -> float:
    """One `now` for the whole command: `--start +1h --deadline +1h` are the same time."""
    if not _NOW:
        _NOW.append(time.time())
    return _NOW[0]


def _when(text: str) -> float:
    """`now`, `+10m`, seconds since the epoch, or a local ISO time -> seconds since the epoch."""
    t = text.strip()
    if t.lower() == "now":
        return _now()
    if t.startswith("+"):
        return _now() + _duration(t[1:])
    try:
        v = float(t)
        if not 0 < v < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not a time")
        return v
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: now, +10m, epoch seconds or 2026-11-21T14:00") from None


def _spread(text: str) -> list[str]:
    """`dc,msb` -> ["dc", "msb"]; `` or `none` -> [] (no spread)."""
    if text.strip().lower() in ("", "none"):
        return []
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of properties, e.g. dc,msb")
    return parts


def _nullable(text: str) -> str | None:
    """`` or `none` clears the value (null)."""
    return None if text.strip().lower() in ("", "none") else text


def _common(parser: argparse.ArgumentParser) -> None:
    """The global options, accepted before the command and after it (SUPPRESS: a subcommand
    that is not given one leaves the top level's value alone)."""
    g = parser.add_argument_group("global options")
    s = argparse.SUPPRESS
    g.add_argument("--url", default=s, help=f"twine-controld's URL (env TWINE_URL, default {DEFAULT_URL})")
    g.add_argument("--token", default=s, help="API token (env TWINE_TOKEN)")
    g.add_argument("--token-file", default=s, help="file holding the API token (env TWINE_TOKEN_FILE)")
    g.add_argument("--ca", default=s, help="CA bundle (PEM) to verify an https daemon against "
                                           "(env TWINE_CA; default the system's CAs)")
    g.add_argument("--json", action="store_true", default=s, help="print the daemon's JSON as it is")
    g.add_argument("--timeout", type=_seconds, default=s, help=f"seconds per request (default {DEFAULT_TIMEOUT:g})")


def _wait(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--wait", nargs="?", type=_seconds, const=DEFAULT_WAIT, default=None, metavar="SECONDS",
                        help=f"wait until {what}; exit 1 if SECONDS (default {DEFAULT_WAIT:g}) pass first")


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=fmt)
    _common(p)
    sub = p.add_subparsers(dest="group", required=True, metavar="COMMAND")

    def leaf(parent, name: str, help_: str) -> argparse.ArgumentParser:
        sp = parent.add_parser(name, help=help_, description=help_)
        _common(sp)
        return sp

    ent = sub.add_parser("entitlement", help="create, modify, list and show entitlements")
    ent_sub = ent.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = leaf(ent_sub, "create", "create an entitlement")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--machine-type", required=True, metavar="T")
    c.add_argument("--quota", required=True, type=_count, metavar="N", help="at most N machines")
    c.add_argument("--profile", metavar="P", help="the host profile of its machines")
    c.add_argument("--owner", metavar="O")
    c.add_argument("--spread", type=_spread, metavar="dc,msb", help="properties its jobs spread over by default")
    c.add_argument("--pin-dc", type=_nullable, metavar="DC", help="keep its jobs in this dc")
    m = leaf(ent_sub, "modify", "change an entitlement (PATCH); '' or none clears --profile / --pin-dc")
    m.add_argument("name", metavar="NAME")
    m.add_argument("--quota", type=_count, metavar="N")
    m.add_argument("--profile", type=_nullable, default=argparse.SUPPRESS, metavar="P")
    m.add_argument("--owner", metavar="O")
    m.add_argument("--spread", type=_spread, metavar="dc,msb")
    m.add_argument("--pin-dc", type=_nullable, default=argparse.SUPPRESS, metavar="DC")
    mv = leaf(ent_sub, "move", "give an entitlement to another scheduler shard (no task restarts)")
    mv.add_argument("name", metavar="NAME")
    mv.add_argument("--shard", type=int, required=True, metavar="N", help="the shard to move it to")
    leaf(ent_sub, "list", "list entitlements")
    leaf(ent_sub, "show", "show an entitlement with its machines and jobs").add_argument("name", metavar="NAME")

    job = sub.add_parser("job", help="run, inspect, update, resize and stop jobs")
    job_sub = job.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = leaf(job_sub, "run", "submit a job spec file (placement is committed at once)")
    r.add_argument("file", metavar="FILE")
    _wait(r, "every task runs")
    leaf(job_sub, "status", "a job and its tasks").add_argument("handle", metavar="HANDLE")
    leaf(job_sub, "list", "list jobs").add_argument("--entitlement", metavar="E", help="only this entitlement's jobs")
    u = leaf(job_sub, "update", "replace a job's spec (a changed task starts a rolling update)")
    u.add_argument("file", metavar="FILE")
    _wait(u, "every task runs at the new spec version")
    rs = leaf(job_sub, "resize", "change a job's task count")
    rs.add_argument("handle", metavar="HANDLE")
    rs.add_argument("count", type=_count, metavar="N")
    _wait(rs, "every task runs")
    st = leaf(job_sub, "stop", "stop a job and remove its tasks")
    st.add_argument("handle", metavar="HANDLE")
    _wait(st, "the job is stopped")

    mach = sub.add_parser("machine", help="list, show, release and clean machines")
    mach_sub = mach.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(mach_sub, "list", "list machines")
    leaf(mach_sub, "show", "a machine with its tasks").add_argument("id", metavar="ID")
    leaf(mach_sub, "release", "end a machine's credential, so that its agent may register it again with a "
                              "bootstrap token (a reinstalled host)").add_argument("id", metavar="ID")
    leaf(mach_sub, "clean", "drop a machine's tombstones: none of the tasks moved off it while it was unhealthy "
                            "runs there any more (it was wiped, or is gone for good); their resources are freed"
         ).add_argument("id", metavar="ID")

    mt = sub.add_parser("maintenance", help="schedule, list, show and end maintenance (the ops planner)")
    mt_sub = mt.add_subparsers(dest="action", required=True, metavar="ACTION")
    sc = leaf(mt_sub, "schedule", "schedule maintenance: jobs on the machines get advance notice; at the deadline "
                                   "what is still there stops; the machines are back after the duration")
    sc.add_argument("--machine", action="append", metavar="ID", help="a machine (repeat for more)")
    sc.add_argument("--dc", metavar="DC", help="every machine in this dc (ANDed with --msb/--rack)")
    sc.add_argument("--msb", metavar="MSB", help="every machine behind this main switchboard")
    sc.add_argument("--rack", metavar="RACK", help="every machine in this rack")
    sc.add_argument("--start", required=True, type=_when, metavar="WHEN", help="when the work begins")
    sc.add_argument("--duration", required=True, type=_duration, metavar="DUR", help="how long the machines are away")
    sc.add_argument("--deadline", type=_when, metavar="WHEN",
                    help="when tasks still on the machines are stopped (at or before --start; default: --start)")
    sc.add_argument("--policy", choices=("move", "stop"),
                    help="for jobs without a TaskController: move tasks away before the deadline, or stop them at "
                         "it and restart them after (default: the daemon's --maintenance-policy)")
    sc.add_argument("--reason", default="", metavar="TEXT")
    leaf(mt_sub, "list", "maintenance not over yet").add_argument("--all", action="store_true", help="also what is over")
    leaf(mt_sub, "show", "a maintenance with the tasks on its machines").add_argument("id", metavar="ID")
    leaf(mt_sub, "end", "end a maintenance now (before its deadline: cancel it)").add_argument("id", metavar="ID")

    tok = sub.add_parser("token", help="API tokens with roles (admin only): create, list, revoke")
    tok_sub = tok.add_subparsers(dest="action", required=True, metavar="ACTION")
    tc = leaf(tok_sub, "create", "make a token; its secret is shown this once")
    tc.add_argument("--role", required=True, choices=("admin", "owner", "reader", "bootstrap"),
                    help="admin: everything; owner: the jobs of its entitlements; reader: reads only; "
                         "bootstrap: registers new machines only, and expires (default 24h)")
    tc.add_argument("--entitlement", action="append", metavar="NAME", help="an entitlement an owner token owns (repeat)")
    tc.add_argument("--expires", type=_duration, metavar="DUR", help="valid this long (default: until revoked; a bootstrap token 24h)")
    tc.add_argument("--description", default="", metavar="TEXT")
    leaf(tok_sub, "list", "the tokens (never their secrets)")
    leaf(tok_sub, "revoke", "end a token now").add_argument("id", metavar="ID")

    leaf(sub, "cluster", "the region's control-plane replicas, shard leaders and the entitlements of each shard")
    leaf(sub, "events", "unavailability events (failures, maintenance)")
    leaf(sub, "discovery", "a job's endpoints").add_argument("handle", metavar="HANDLE")
    return p


def _settings(args: argparse.Namespace, env: dict) -> tuple[str, str | None, float, bool]:
    """URL, token, timeout and --json from the options, else the environment, else defaults."""
    url = getattr(args, "url", None) or env.get("TWINE_URL") or DEFAULT_URL
    u = yarl.URL(url) if "://" in url else None
    if u is None or u.scheme not in ("http", "https") or not u.host:
        raise CliError(EXIT_INPUT, f"--url: {url!r} is not an http(s) URL like {DEFAULT_URL}")
    token, token_file = getattr(args, "token", None), getattr(args, "token_file", None)
    if token and token_file:
        raise CliError(EXIT_INPUT, "give --token or --token-file, not both")
    if not token and not token_file:  # the options win over the environment
        token = env.get("TWINE_TOKEN") or None
        token_file = None if token else env.get("TWINE_TOKEN_FILE") or None
    if token_file:
        token = read_token_file(token_file)
    timeout = getattr(args, "timeout", None)
    return url, token, DEFAULT_TIMEOUT if timeout is None else timeout, bool(getattr(args, "json", False))


def read_token_file(path: str) -> str:
    """The first non-empty, non-comment line of a token file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(EXIT_INPUT, f"--token-file {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise CliError(EXIT_INPUT, f"--token-file {path}: holds no token")


def split_handle(handle: str) -> str:
    """`ent/name` -> the URL path `ent/name` (each part quoted). Bad handles are exit 2."""
    ent, sep, name = handle.partition("/")
    if not (sep and ent and name) or "/" in name:
        raise CliError(EXIT_INPUT, f"{handle!r} is not a job handle <entitlement>/<name>")
    return f"{quote(ent, safe='')}/{quote(name, safe='')}"


def _q(name: str) -> str:
    return quote(name, safe="")


# --- commands -------------------------------------------------------------------------------


class Out:
    """Prints the daemon's JSON indented (--json) or rendered as text."""

    def __init__(self, as_json: bool):
        self.as_json = as_json

    def __call__(self, data: Any, text: Callable[[Any], str]) -> None:
        rendered = None
        if not self.as_json and isinstance(data, dict):
            try:
                rendered = text(data)
            except (AttributeError, KeyError, TypeError, ValueError):  # a shape docs/api.md does not describe
                print(f"{PROG}: cannot show this answer as a table; its JSON follows", file=sys.stderr)
        if rendered is None:
            json.dump(data, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(rendered)
        sys.stdout.flush()


Command = Callable[[Api, argparse.Namespace, Out], Awaitable[int]]


async def ent_create(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {"name": args.name, "machine_type": args.machine_type, "quota": args.quota}
    if args.profile is not None:
        body["profile"] = _nullable(args.profile)
    if args.owner is not None:
        body["owner"] = args.owner
    if args.spread is not None or args.pin_dc is not None:
        body["spread"] = {"properties": DEFAULT_SPREAD if args.spread is None else args.spread, "pinned_dc": args.pin_dc}
    out(await api.call("POST", "/v1/entitlements", body), render.entitlement_show)
    return EXIT_OK


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
            spread = dict((await api.call("GET", f"/v1/entitlements/{_q(args.name)}")).get("spread") or {})
            spread.setdefault("properties", DEFAULT_SPREAD)
            spread.setdefault("pinned_dc", None)
            if args.spread is not None:
                spread["properties"] = args.spread
            else:
                spread["pinned_dc"] = args.pin_dc
            body["spread"] = spread
    if not body:
        raise CliError(EXIT_INPUT, "entitlement modify: nothing to change; give --quota, --profile, --owner, --spread or --pin-dc")
    out(await api.call("PATCH", f"/v1/entitlements/{_q(args.name)}", body), render.entitlement_show)
    return EXIT_OK


async def ent_list(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/entitlements"), render.entitlement_list)
    return EXIT_OK


async def ent_show(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/entitlements/{_q(args.name)}"), render.entitlement_show)
    return EXIT_OK


def rollout_progress(job: dict) -> tuple[bool, str]:
    """Is every task 0..count-1 running at the job's spec_version (and no task beyond count left
    but stopped ones)? With a line saying how far it got: tasks at an older version, tasks down,
    operations waiting for the job's TaskController or held by rate limits."""
    count, version = job.get("count"), job.get("spec_version")
    if job.get("state") in ("stopping", "stopped"):
        return False, f"the job is {job['state']}"
    if not isinstance(count, int):
        return False, "the job has no count"
    tasks = job.get("tasks") or []
    ready = {t.get("index") for t in tasks if t.get("state") == "running" and t.get("spec_version") == version}
    extra = [t for t in tasks if isinstance(t.get("index"), int) and t["index"] >= count and t.get("state") != "stopped"]
    n = sum(1 for i in range(count) if i in ready)
    wanted = [t for t in tasks if isinstance(t.get("index"), int) and t["index"] < count]
    older = sum(1 for t in wanted if t.get("spec_version") != version)
    down = sum(1 for t in wanted if t.get("state") != "running") + count - len(wanted)
    tc, ops = job.get("taskcontrol") or {}, job.get("operations") or {}
    waiting = len(tc.get("pending") or []) if isinstance(tc, dict) else 0
    limited = ops.get("rate_limited") or 0 if isinstance(ops, dict) else 0
    parts = [f"{older} at an older version" if older else "", f"{down} down" if down else "",
             f"{waiting} waiting for the TaskController" if waiting else "",
             f"{limited} held by rate limits" if limited else "", f"{len(extra)} more still to stop" if extra else ""]
    line = f"{n} of {count} tasks running at spec version {version}"
    if any(parts):
        line += "; " + ", ".join(p for p in parts if p)
    return n == count and not extra, line


def stop_progress(job: dict) -> tuple[bool, str]:
    state = job.get("state")
    return state == "stopped", f"state {state}"


async def wait_job(api: Api, handle: str, seconds: float, progress: Callable[[dict], tuple[bool, str]],
                   gone_ok: bool = False, say: Callable[[str], None] | None = None) -> tuple[bool, dict | None, str]:
    """Poll GET /v1/jobs/{handle} until `progress` says done or `seconds` pass. A job that is
    gone (404) counts as done when `gone_ok` (a stopped job may be removed). `say` is given each
    progress line that differs from the one before, with the seconds waited so far."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + seconds
    said = None
    while True:
        try:
            job = await api.call("GET", f"/v1/jobs/{split_handle(handle)}")
        except ApiError as e:
            if gone_ok and e.status == 404:
                return True, None, "the job is gone"
            raise
        done, line = progress(job)
        if say is not None and line != said:
            said = line
            say(f"{handle}: {line}  ({loop.time() - start:.0f}s)")
        if done:
            return True, job, line
        if job.get("state") in ("stopping", "stopped") and progress is rollout_progress:
            return False, job, line  # it will not come up any more
        left = deadline - loop.time()
        if left <= 0:
            return False, job, line
        await asyncio.sleep(min(POLL_INTERVAL, left))


async def _show_or_wait(api: Api, args, out: Out, job: dict, handle: str, progress, what: str) -> int:
    if args.wait is None:
        out(job, render.job_status)
        return EXIT_OK
    done, final, line = await wait_job(api, handle, args.wait, progress, gone_ok=progress is stop_progress,
                                       say=lambda text: print(text, file=sys.stderr, flush=True))
    if final is None:  # stopped and removed
        if out.as_json:
            out(job, render.job_status)
        else:
            print(f"job {handle}: stopped and removed")
        return EXIT_OK
    out(final, render.job_status)
    if not done:
        raise CliError(EXIT_FAILED, f"{handle}: not {what} after {args.wait:g}s: {line}")
    return EXIT_OK


def _handle_of(job: Any, fallback: str) -> str:
    h = job.get("handle") if isinstance(job, dict) else None
    return h if isinstance(h, str) and h else fallback


async def job_run(api: Api, args, out: Out) -> int:
    spec = args.spec
    job = await api.call("POST", "/v1/jobs", spec)
    handle = _handle_of(job, f"{spec.get('entitlement')}/{spec.get('name')}")
    return await _show_or_wait(api, args, out, job, handle, rollout_progress, "running")


async def job_update(api: Api, args, out: Out) -> int:
    job = await api.call("PUT", f"/v1/jobs/{split_handle(args.handle)}", args.spec)
    return await _show_or_wait(api, args, out, job, _handle_of(job, args.handle), rollout_progress, "running")


async def job_status(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/jobs/{split_handle(args.handle)}"), render.job_status)
    return EXIT_OK


async def job_list(api: Api, args, out: Out) -> int:
    params = {"entitlement": args.entitlement} if args.entitlement else None
    out(await api.call("GET", "/v1/jobs", params=params), render.job_list)
    return EXIT_OK


async def job_resize(api: Api, args, out: Out) -> int:
    job = await api.call("POST", f"/v1/jobs/{split_handle(args.handle)}/resize", {"count": args.count})
    return await _show_or_wait(api, args, out, job, args.handle, rollout_progress, "running")


async def job_stop(api: Api, args, out: Out) -> int:
    job = await api.call("DELETE", f"/v1/jobs/{split_handle(args.handle)}")
    return await _show_or_wait(api, args, out, job, args.handle, stop_progress, "stopped")


async def machine_list(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/machines"), render.machine_list)
    return EXIT_OK


async def machine_show(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/machines/{_q(args.id)}"), render.machine_show)
    return EXIT_OK


async def machine_release(api: Api, args, out: Out) -> int:
    out(await api.call("POST", f"/v1/machines/{_q(args.id)}/release"), render.machine_show)
    return EXIT_OK


async def machine_clean(api: Api, args, out: Out) -> int:
    out(await api.call("POST", f"/v1/machines/{_q(args.id)}/clean"), render.machine_show)
    return EXIT_OK


async def events(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/events"), render.event_list)
    return EXIT_OK


async def maintenance_schedule(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {"start": args.start, "duration": args.duration, "reason": args.reason}
    for k in ("dc", "msb", "rack", "deadline", "policy"):
        if getattr(args, k) is not None:
            body[k] = getattr(args, k)
    if args.machine:
        body["machines"] = args.machine
    if not (args.machine or args.dc or args.msb or args.rack):
        raise CliError(EXIT_INPUT, "name the machines: --machine ID (repeatable), --dc, --msb or --rack")
    out(await api.call("POST", "/v1/maintenance", body), render.maintenance_show)
    return EXIT_OK


async def maintenance_list(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/maintenance", params={"all": "1"} if args.all else None), render.maintenance_list)
    return EXIT_OK


async def maintenance_show(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/maintenance/{_q(args.id)}"), render.maintenance_show)
    return EXIT_OK


async def maintenance_end(api: Api, args, out: Out) -> int:
    out(await api.call("POST", f"/v1/maintenance/{_q(args.id)}/end"), render.maintenance_show)
    return EXIT_OK


async def ent_move(api: Api, args, out: Out) -> int:
    out(await api.call("POST", f"/v1/entitlements/{_q(args.name)}/move", {"shard": args.shard}), render.entitlement_show)
    return EXIT_OK


async def token_create(api: Api, args, out: Out) -> int:
    body: dict[str, Any] = {"role": args.role, "entitlements": args.entitlement or [], "description": args.description}
    if args.expires is not None:
        body["expires_in"] = args.expires
    out(await api.call("POST", "/v1/tokens", body), render.token_created)
    return EXIT_OK


async def token_list(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/tokens"), render.token_list)
    return EXIT_OK


async def token_revoke(api: Api, args, out: Out) -> int:
    out(await api.call("DELETE", f"/v1/tokens/{_q(args.id)}"), lambda b: f"token {b['revoked']} revoked")
    return EXIT_OK


async def cluster(api: Api, args, out: Out) -> int:
    out(await api.call("GET", "/v1/cluster"), render.cluster)
    return EXIT_OK


async def discovery(api: Api, args, out: Out) -> int:
    out(await api.call("GET", f"/v1/discovery/{split_handle(args.handle)}"), render.discovery)
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Command] = {
    ("entitlement", "create"): ent_create,
    ("entitlement", "modify"): ent_modify,
    ("entitlement", "list"): ent_list,
    ("entitlement", "show"): ent_show,
    ("entitlement", "move"): ent_move,
    ("cluster", None): cluster,
    ("token", "create"): token_create,
    ("token", "list"): token_list,
    ("token", "revoke"): token_revoke,
    ("job", "run"): job_run,
    ("job", "status"): job_status,
    ("job", "list"): job_list,
    ("job", "update"): job_update,
    ("job", "resize"): job_resize,
    ("job", "stop"): job_stop,
    ("machine", "list"): machine_list,
    ("machine", "show"): machine_show,
    ("machine", "release"): machine_release,
    ("machine", "clean"): machine_clean,
    ("maintenance", "schedule"): maintenance_schedule,
    ("maintenance", "list"): maintenance_list,
    ("maintenance", "show"): maintenance_show,
    ("maintenance", "end"): maintenance_end,
    ("events", None): events,
    ("discovery", None): discovery,
}


def _tls(args: argparse.Namespace, env: dict) -> ssl.SSLContext | None:
    """--ca or TWINE_CA: the CA an https daemon's certificate must chain to."""
    ca = getattr(args, "ca", None) or env.get("TWINE_CA") or None
    if ca is None:
        return None
    try:
        return tls_files.client_context(ca, field="--ca")
    except InputError as e:
        raise CliError(EXIT_INPUT, f"--ca {ca}: {e.why}") from None


async def _run(command: Command, args: argparse.Namespace, url: str, token: str | None, timeout: float, out: Out,
               tls: ssl.SSLContext | None = None) -> int:
    async with Api(url, token, timeout, tls) as api:
        return await command(api, args, out)


def main(argv: list[str] | None = None) -> int:
    _NOW.clear()  # relative times are relative to this command's start
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help: 0; a bad argument: argparse's 2
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    env = os.environ
    command = COMMANDS[(args.group, getattr(args, "action", None))]
    token = None
    try:
        url, token, timeout, as_json = _settings(args, env)
        if getattr(args, "file", None) is not None:  # job run / update: parsed and checked before anything is sent
            args.spec = read_spec(args.file)
            if command is job_update:
                args.handle = spec_handle(args.spec, args.file)
        tls = _tls(args, env)
        return asyncio.run(_run(command, args, url, token, timeout, Out(as_json), tls))
    except SpecError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_INPUT
    except CliError as e:
        msg = e.message
        if e.code == EXIT_UNAUTHORIZED and not token:
            msg += " (no token given: use --token, --token-file, TWINE_TOKEN or TWINE_TOKEN_FILE)"
        print(f"{PROG}: {msg}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
