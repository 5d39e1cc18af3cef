"""`--wait`: a job's progress polled until it is done (every task running at its spec version, or
the job stopped), each change of it said on stderr."""

from __future__ import annotations

import asyncio
import sys
from typing import Callable

from controlplane.cli import render
from controlplane.cli.api import EXIT_FAILED, EXIT_OK, Api, ApiError, CliError, split_handle
from controlplane.cli.output import Out

POLL_INTERVAL = 1.0  # seconds between GETs while waiting


def rollout_progress(job: dict) -> tuple[bool, str]:
    """Is every task of the job (0..count-1, or with gaps: 0..count+len(gaps)-1 but the gaps)
    running at the job's spec_version (and no other task left but stopped ones)? With a line saying how far it got: tasks at an older version, tasks down,
    operations waiting for the job's TaskController or held by rate limits."""
    count, version = job.get("count"), job.get("spec_version")
    if job.get("state") in ("stopping", "stopped"):
        return False, f"the job is {job['state']}"
    if not isinstance(count, int):
        return False, "the job has no count"
    tasks = job.get("tasks") or []
    gaps = {i for i in job.get("gaps") or [] if isinstance(i, int)}
    live = set(range(count + len(gaps))) - gaps
    ready = {t.get("index") for t in tasks if t.get("state") == "running" and t.get("spec_version") == version}
    extra = [t for t in tasks if t.get("index") not in live and t.get("state") != "stopped"]
    n = sum(1 for i in live if i in ready)
    wanted = [t for t in tasks if t.get("index") in live]
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


async def show_or_wait(api: Api, args, out: Out, job: dict, handle: str, progress, what: str) -> int:
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
