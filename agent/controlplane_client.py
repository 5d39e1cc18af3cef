"""The agent's side of twine-controld (docs/api.md, "Agents"): register, long-poll the desired
state, heartbeat.

`ControlPlaneClient` holds the machine's credential (state_dir/credential, mode 0600) and makes the
calls; `ControlPlaneSource` is the DesiredSource fed by the long poll; `heartbeat_loop` reports the
host. No loop here raises: while the daemon is unreachable the agent keeps its last desired state
(tasks keep running) and the loops retry with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import aiohttp
import psutil

from agent import atomic
from agent.config import AgentConfig
from agent.desired import OnChange, OnError
from agent.errors import DesiredStateError
from agent.models import DesiredState, TaskSpec
from agent.profiles import appliers
from agent.runtime.base import L_SPEC_VERSION, ContainerInfo

log = logging.getLogger("twine.agent.controlplane")
CREDENTIAL = "credential"
LONG_POLL_WAIT = 25  # seconds the daemon may hold a desired-state request
REQUEST_TIMEOUT = 10.0  # seconds for a call, on top of the long poll's wait
DEBOUNCE = 0.05  # a burst of changes becomes one heartbeat
BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0
HUGEPAGES = Path("/sys/kernel/mm/hugepages")
CGROUP2_MARKER = Path("/sys/fs/cgroup/cgroup.controllers")


class ControlPlaneError(Exception):
    """The daemon answered, but with an error or a body that breaks the contract."""


class Unauthorized(ControlPlaneError):
    """401: the credential (or bootstrap token) is missing or wrong."""


# Everything a call can fail with; the loops catch exactly these.
CALL_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, ControlPlaneError)


def describe(e: BaseException) -> str:
    """A short message for /status and on_error."""
    if isinstance(e, ControlPlaneError):
        return f"control plane: {e}"
    return f"control plane unreachable: {e or type(e).__name__}"


class Backoff:
    """Delays of 0.2, 0.4, ... capped at 5 seconds, from the first failure until a success."""

    def __init__(self) -> None:
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return min(BACKOFF_MIN * 2 ** (self.failures - 1), BACKOFF_MAX)

    def reset(self) -> None:
        self.failures = 0


# -- what the agent tells the daemon -------------------------------------------------------------


def capacity(config: AgentConfig) -> dict:
    """The host's capacity for registration; cpus and memory_mb may be claimed shares (config)."""
    disk = psutil.disk_usage(str(config.state_dir if config.state_dir.exists() else Path("/")))
    try:
        pages = sorted(int(n[len("hugepages-"):-len("kB")]) for n in os.listdir(HUGEPAGES) if n.startswith("hugepages-"))
    except OSError:
        pages = []
    return {
        "cpus": config.cpus or float(psutil.cpu_count() or 1),
        "memory_mb": config.memory_mb or psutil.virtual_memory().total >> 20,
        "disk_gb": round(disk.total / 2**30, 1),
        "hugepage_sizes_kb": pages,
        "cgroup_version": 2 if CGROUP2_MARKER.exists() else 1,
        "supports": list(appliers.known()),
    }


def agent_version() -> str:
    try:
        return metadata.version("twine")
    except metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def machine_info(config: AgentConfig) -> dict:
    """The body of POST /v1/agent/register."""
    return {
        "machine_id": config.machine_id,
        "hostname": config.hostname,
        "labels": asdict(config.labels),
        "capacity": capacity(config),
        "address": config.address or config.listen,
        "version": agent_version(),
    }


def _container_report(c: ContainerInfo, error: str) -> dict:
    state = "running" if c.running else "starting" if c.status == "created" else "exited"
    return {
        "job": c.task.job, "index": c.task.index, "spec_version": int(c.labels.get(L_SPEC_VERSION, "0")),
        "state": state, "exit_code": c.exit_code, "restarts": c.generation, "error": error,
    }


def task_reports(containers: list[ContainerInfo], desired: tuple[TaskSpec, ...], errors: dict[str, str]) -> list[dict]:
    """One entry per container of this machine, plus desired tasks that failed to get one."""
    out = [_container_report(c, errors.get(str(c.task), "")) for c in containers]
    have = {c.task for c in containers}
    out += [
        {"job": t.job, "index": t.index, "spec_version": t.spec_version, "state": "failed",
         "exit_code": None, "restarts": 0, "error": errors[str(t.key)]}
        for t in desired if t.key not in have and str(t.key) in errors
    ]
    return sorted(out, key=lambda r: (r["job"], r["index"], r["restarts"]))


def report_digest(profile: dict, tasks: list[dict]) -> str:
    """sha256 of the canonical JSON of profile and tasks: unchanged digest, unchanged report."""
    canonical = json.dumps({"profile": profile, "tasks": tasks}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# -- the client ----------------------------------------------------------------------------------


class ControlPlaneClient:
    """One machine's calls to twine-controld. Registration happens on the first call that needs a
    credential (and again after a 401), so an unreachable daemon never holds up the agent's start."""

    def __init__(self, url: str, bootstrap_token: str, state_dir: Path, machine_info: dict, heartbeat_interval: float = 1.0):
        self.url = url.rstrip("/")
        self.bootstrap_token = bootstrap_token
        self.machine_info = machine_info
        self.machine_id: str = machine_info["machine_id"]
        self.interval = heartbeat_interval
        self.path = Path(state_dir) / CREDENTIAL
        self.credential = self._load_credential()
        self.registered = False  # the daemon accepted our credential in this run
        self.last_heartbeat_ok = False
        self.error = ""
        self._session: aiohttp.ClientSession | None = None
        self._register_lock = asyncio.Lock()
        self._poke = asyncio.Event()
        self._seq = time.time_ns() // 1_000_000  # increasing across agent restarts too
        self._accepted_digest: str | None = None

    def status(self) -> dict:
        return {"url": self.url, "registered": self.registered, "last_heartbeat_ok": self.last_heartbeat_ok, "error": self.error}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- credential --------------------------------------------------------------------------

    def _load_credential(self) -> str | None:
        try:
            data = atomic.read_json(self.path)
        except ValueError:  # a torn or foreign file: register again
            return None
        if not isinstance(data, dict) or (data.get("url"), data.get("machine_id")) != (self.url, self.machine_id):
            return None
        return data.get("credential") or None

    def _save_credential(self, credential: str) -> None:
        # The temporary file is created under umask 077, so the secret is never readable by others.
        old = os.umask(0o077)
        try:
            atomic.write_json(self.path, {"url": self.url, "machine_id": self.machine_id, "credential": credential})
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def register(self) -> None:
        """POST /v1/agent/register with the bootstrap token; store the new credential."""
        try:
            answer = await self._request("POST", "/v1/agent/register", self.bootstrap_token, REQUEST_TIMEOUT, json=self.machine_info)
        except Unauthorized as e:
            raise ControlPlaneError(f"registration refused: {e}") from None
        credential = answer.get("credential")
        if not isinstance(credential, str) or not credential:
            raise ControlPlaneError("registration answer has no credential")
        await asyncio.to_thread(self._save_credential, credential)
        self.credential, self.registered, self._accepted_digest = credential, True, None
        log.info("registered machine %s with %s", self.machine_id, self.url)

    async def _credential(self, stale: str | None = None) -> str:
        """The credential, registering first when there is none or it is `stale` (got a 401)."""
        async with self._register_lock:
            if self.credential is None or self.credential == stale:
                await self.register()
            assert self.credential is not None
            return self.credential

    # -- calls -------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, token: str, timeout: float, **kw: Any) -> dict:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {token}"}
        async with self._session.request(method, self.url + path, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout), **kw) as r:
            text = (await r.read()).decode(errors="replace")
        try:
            body = json.loads(text) if text else {}
        except ValueError:
            body = {"why": text[:200]}
        if not isinstance(body, dict):
            raise ControlPlaneError(f"{method} {path}: answer is not a JSON object")
        if r.status == 401:
            raise Unauthorized(body.get("why") or "unauthorized")
        if r.status >= 300:
            field = f" ({body['field']})" if body.get("field") else ""
            raise ControlPlaneError(f"{method} {path}: {r.status} {body.get('error', '')}{field}: {body.get('why', '')}")
        return body

    async def call(self, method: str, path: str, timeout: float = REQUEST_TIMEOUT, **kw: Any) -> dict:
        """A credential call. A 401 re-registers once with the bootstrap token and retries."""
        try:
            credential = await self._credential()
            try:
                answer = await self._request(method, path, credential, timeout, **kw)
            except Unauthorized:
                log.warning("credential refused; registering again")
                self.registered = False
                answer = await self._request(method, path, await self._credential(stale=credential), timeout, **kw)
        except CALL_ERRORS as e:
            self._failed(describe(e))
            raise
        if self.error:
            log.info("control plane %s answers again", self.url)
        self.registered, self.error = True, ""
        return answer

    def _failed(self, message: str) -> None:
        if message != self.error:
            log.warning("%s", message)
        self.error = message

    async def desired(self, version: str, wait: int = LONG_POLL_WAIT) -> dict:
        """GET /v1/agent/desired: at once when the daemon's version is not `version`, else after a change or `wait` s."""
        answer = await self.call("GET", "/v1/agent/desired", wait + REQUEST_TIMEOUT, params={"version": version, "wait": str(wait)})
        if answer.get("version") is None:
            error = ControlPlaneError("desired state answer has no version")
            self._failed(describe(error))
            raise error
        return answer

    async def announce_reboot(self) -> dict:
        """POST /v1/agent/shutdown: the host is going down for a reboot (a planned absence)."""
        return await self.call("POST", "/v1/agent/shutdown", 3.0, json={"reason": "reboot"})

    # -- heartbeats --------------------------------------------------------------------------

    def notify(self) -> None:
        """Something changed: send a heartbeat now (after a short debounce), not at the next interval."""
        self._poke.set()

    async def heartbeat(self, report: dict) -> None:
        """POST /v1/agent/heartbeat. report: desired_version, health, profile, tasks."""
        digest = report_digest(report["profile"], report["tasks"])
        self._seq += 1
        body = {
            "machine_id": self.machine_id, "seq": self._seq, "desired_version": report["desired_version"],
            "health": report["health"], "profile": report["profile"], "digest": digest,
        }
        if digest != self._accepted_digest:
            body["tasks"] = report["tasks"]
        try:
            answer = await self.call("POST", "/v1/agent/heartbeat", json=body)
        except CALL_ERRORS:
            self.last_heartbeat_ok = False
            raise
        self.last_heartbeat_ok = True
        if answer.get("resend"):
            self._accepted_digest = None
            self.notify()
        else:
            self._accepted_digest = digest
        interval = answer.get("interval")
        if isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval > 0:
            self.interval = float(interval)

    async def heartbeat_loop(self, report: Callable[[], dict]) -> None:
        """Heartbeat every `interval` seconds and soon after notify(); runs until cancelled."""
        backoff = Backoff()
        while True:
            self._poke.clear()
            try:
                await self.heartbeat(report())
            except CALL_ERRORS:
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            await self._pause(self.interval)

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._poke.wait(), seconds)
        except TimeoutError:
            return
        await asyncio.sleep(DEBOUNCE)


class ControlPlaneSource:
    """The desired state from twine-controld's long poll (a DesiredSource).

    `version` is the one the agent already has (its cache), so an agent restarted onto the same
    version changes nothing. A version that fails to parse goes to on_error and is not asked for
    again; while the daemon is unreachable on_error gets a short message, and once it answers
    again on_error gets the current version's rejection, or "" (no error).
    """

    def __init__(self, client: ControlPlaneClient, version: str, wait: int = LONG_POLL_WAIT):
        self.client = client
        self.version = version
        self.wait = wait

    async def watch(self, on_change: OnChange, on_error: OnError) -> None:
        backoff = Backoff()
        rejected = ""  # why self.version was refused; "" when it was not
        while True:
            try:
                data = await self.client.desired(self.version, self.wait)
            except CALL_ERRORS:
                on_error(self.client.error)
                await asyncio.sleep(backoff.next())
                continue
            if backoff.failures:
                on_error(rejected)
                backoff.reset()
            version = str(data["version"])
            if version == self.version:
                continue
            self.version = version
            try:
                desired = DesiredState.from_json(data, self.client.url, version=version)
            except DesiredStateError as e:
                log.error("rejected desired state %s: %s", version, e)
                rejected = str(e)
                on_error(rejected)
                continue
            rejected = ""
            await on_change(desired)
