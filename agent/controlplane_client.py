"""The agent's side of twine-controld (docs/api.md, "Agents"): register, long-poll the desired
state, heartbeat.

`ControlPlaneClient` holds the machine's credential (state_dir/credential, mode 0600) and makes the
calls; `ControlPlaneSource` is the DesiredSource fed by the long poll; `heartbeat_loop` reports the
host. No loop here raises: while the daemon is unreachable the agent keeps its last desired state
(tasks keep running) and the loops retry with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import aiohttp

from agent import atomic
from agent.desired import OnChange, OnError
from agent.errors import DesiredStateError
from agent.models import DesiredState
from agent.report import report_digest

log = logging.getLogger("twine.agent.controlplane")
CREDENTIAL = "credential"
CREDENTIAL_HEADER = "X-Twine-Credential"  # on a registration: the credential the agent holds
LONG_POLL_WAIT = 25  # seconds the daemon may hold a desired-state request
REQUEST_TIMEOUT = 10.0  # seconds for a call, on top of the long poll's wait
CONNECT_TIMEOUT = 3.0  # a replica that does not accept the connection by then is failed over
FAILOVER_STATUS = (502, 503, 504)  # a proxy's or a replica's "not now": another replica may answer
DEBOUNCE = 0.05  # a burst of changes becomes one heartbeat
HINT_PAUSE = 30.0  # seconds a heartbeat_to that failed is not followed again (the list's replica relays)
MIN_BEAT_WAIT = 2.0  # seconds a heartbeat waits for an answer at least (a busy replica is not a stuck one)
BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0


class ControlPlaneError(Exception):
    """The daemon answered, but with an error or a body that breaks the contract."""


class Unauthorized(ControlPlaneError):
    """401: the credential (or bootstrap token) is missing or wrong."""


class Unavailable(ControlPlaneError):
    """502, 503 or 504: this replica cannot answer now."""


# Everything a call can fail with; the loops catch exactly these.
CALL_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, ControlPlaneError)


def fails_over(e: BaseException) -> bool:
    """Whether `e` says the replica did not answer (try another), rather than that it refused the call."""
    return isinstance(e, Unavailable) or not isinstance(e, ControlPlaneError)


def _short(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _answer(method: str, path: str, status: int, text: str) -> dict:
    """The JSON object of an answer, or the ControlPlaneError its status means."""
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {"why": text[:200]}
    if not isinstance(body, dict):
        body = {"why": text[:200]} if status >= 300 else None
        if body is None:
            raise ControlPlaneError(f"{method} {path}: answer is not a JSON object")
    if status == 401:
        raise Unauthorized(body.get("why") or "unauthorized")
    if status >= 300:
        field = f" ({body['field']})" if body.get("field") else ""
        kind = Unavailable if status in FAILOVER_STATUS else ControlPlaneError
        raise kind(f"{method} {path}: {status} {body.get('error', '')}{field}: {body.get('why', '')}")
    return body


def describe(e: BaseException, url: str = "") -> str:
    """A short message for /status and on_error."""
    if isinstance(e, ControlPlaneError):
        return f"control plane: {e}"
    why = _short(e)
    where = f"{url}: " if url and urlsplit(url).netloc not in why else ""
    return f"control plane unreachable: {where}{why}"


class Backoff:
    """Delays of 0.2, 0.4, ... capped at 5 seconds, from the first failure until a success."""

    def __init__(self) -> None:
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return min(BACKOFF_MIN * 2 ** (self.failures - 1), BACKOFF_MAX)

    def reset(self) -> None:
        self.failures = 0


# -- the client ----------------------------------------------------------------------------------


class ControlPlaneClient:
    """One machine's calls to twine-controld. Registration happens on the first call that needs a
    credential (and again after a 401), so an unreachable daemon never holds up the agent's start.

    `urls` are replicas of one region; any of them answers any call. Calls go to one of them (the
    current one) until it fails to answer (connection error, timeout, 502/503/504); then the next
    call goes to the next URL of the list, round robin, at the pace of the loops' backoff. A
    heartbeat answer may name the replica that checks this machine's health (`heartbeat_to`):
    heartbeats, and only they, go there until it fails, and then to the list again at once (that
    replica, or any that just failed to answer, is not followed as a hint for HINT_PAUSE seconds:
    the list's replica relays).
    A heartbeat answer also says the region's heartbeat timeout: when a heartbeat has another
    replica to go to (a hint, or a list of several), a replica is given half of it to answer, not
    REQUEST_TIMEOUT, so that a replica which takes the connection but does not answer (cut off
    from this machine, or stuck) is left while there is time for another to hear the machine
    before the region fails it.
    """

    def __init__(self, urls: str | Sequence[str], bootstrap_token: str, state_dir: Path, machine_info: dict,
                 heartbeat_interval: float = 1.0, tls: ssl.SSLContext | None = None):
        self.urls = tuple(u.rstrip("/") for u in ((urls,) if isinstance(urls, str) else urls))
        if not self.urls:
            raise ValueError("no control-plane URL")
        self._current = 0
        self.heartbeat_to: str | None = None  # the health-checking replica, when it is not self.url
        self.bootstrap_token = bootstrap_token
        self.tls = tls  # how https URLs are verified (None: the system's CAs)
        self.machine_info = machine_info
        self.machine_id: str = machine_info["machine_id"]
        self.region: str = machine_info["labels"]["region"]
        self.interval = heartbeat_interval
        self.heartbeat_timeout: float | None = None  # the region's, once an answer has said it
        self.path = Path(state_dir) / CREDENTIAL
        self.credential = self._load_credential()
        self.registered = False  # the daemon accepted our credential in this run
        self.last_heartbeat_ok = False
        self.error = ""
        self.desired_from = ""  # the URL that sent the last desired state
        self._logged: set[str] = set()  # failures logged since the last answer: an outage logs each once
        self._bad_hint = ""  # the last heartbeat_to ignored (logged once)
        self._unanswered: dict[str, float] = {}  # replicas that failed to answer -> when (monotonic)
        self._session: aiohttp.ClientSession | None = None
        self._register_lock = asyncio.Lock()
        self._poke = asyncio.Event()
        self._seq = time.time_ns() // 1_000_000  # increasing across agent restarts too
        self._accepted_digest: str | None = None

    @property
    def url(self) -> str:
        """The URL calls go to now."""
        return self.urls[self._current]

    def status(self) -> dict:
        return {"url": self.url, "urls": list(self.urls), "heartbeat_to": self.heartbeat_to, "registered": self.registered,
                "last_heartbeat_ok": self.last_heartbeat_ok, "error": self.error}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # -- credential --------------------------------------------------------------------------

    def _load_credential(self) -> str | None:
        try:
            data = atomic.read_json(self.path)
        except ValueError:  # a torn or foreign file: register again
            return None
        if not isinstance(data, dict) or data.get("machine_id") != self.machine_id:
            return None
        # Every replica of the region knows the credential, so it is the region's. A file written
        # before replicas is keyed by its one URL: still ours when that URL is in the list.
        ours = data["region"] == self.region if "region" in data else data.get("url") in self.urls
        return (data.get("credential") or None) if ours else None

    def _save_credential(self, credential: str, url: str) -> None:
        # The temporary file is created under umask 077, so the secret is never readable by others.
        old = os.umask(0o077)
        try:
            atomic.write_json(self.path, {"machine_id": self.machine_id, "region": self.region, "url": url,
                                          "credential": credential})
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def register(self) -> None:
        """POST /v1/agent/register with the bootstrap token; store the new credential."""
        url = self.url
        # the credential we hold, if any: an existing machine id is registered again only with it
        # (or after an admin's release), so a bootstrap token cannot take a live machine over
        extra = {"headers": {CREDENTIAL_HEADER: self.credential}} if self.credential else {}
        try:
            answer = await self._request(url, "POST", "/v1/agent/register", self.bootstrap_token, REQUEST_TIMEOUT,
                                         json=self.machine_info, **extra)
        except Unauthorized as e:
            raise ControlPlaneError(f"registration refused: {e}") from None
        credential = answer.get("credential")
        if not isinstance(credential, str) or not credential:
            raise ControlPlaneError("registration answer has no credential")
        await asyncio.to_thread(self._save_credential, credential, url)
        self.credential, self.registered, self._accepted_digest = credential, True, None
        log.info("registered machine %s with %s (region %s)", self.machine_id, url, self.region)

    async def _credential(self, stale: str | None = None) -> str:
        """The credential, registering first when there is none or it is `stale` (got a 401)."""
        async with self._register_lock:
            if self.credential is None or self.credential == stale:
                await self.register()
            assert self.credential is not None
            return self.credential

    # -- calls -------------------------------------------------------------------------------

    async def _request(self, url: str, method: str, path: str, token: str, timeout: float, **kw: Any) -> dict:
        """One HTTP call to `url`. When `url` fails to answer, the next call goes elsewhere."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls or True))
        headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
        limits = aiohttp.ClientTimeout(total=timeout, sock_connect=min(CONNECT_TIMEOUT, timeout))
        try:
            async with self._session.request(method, url + path, headers=headers, timeout=limits, **kw) as r:
                text = (await r.read()).decode(errors="replace")
            body = _answer(method, path, r.status, text)
        except CALL_ERRORS as e:
            if fails_over(e):
                self._fail_over(url, e)
            raise
        return body

    def _fail_over(self, url: str, e: BaseException) -> None:
        """`url` did not answer: leave it, unless a concurrent call has left it already."""
        self._unanswered[url] = time.monotonic()  # not followed as a hint for a while either
        if url == self.heartbeat_to:
            self.heartbeat_to = None
            log.warning("heartbeat replica %s failed (%s); heartbeats go to %s again (for %.0f s at least)",
                        url, _short(e), self.url, HINT_PAUSE)
        if url != self.url or len(self.urls) == 1:
            return
        self._current = (self._current + 1) % len(self.urls)
        if self.heartbeat_to == self.url:
            self.heartbeat_to = None  # the hinted replica is now the one in use: no hint to follow
        if url not in self._logged:
            self._logged.add(url)
            log.warning("control plane %s failed (%s); switching to %s", url, _short(e), self.url)

    async def _call(self, method: str, path: str, timeout: float, url: str | None = None, **kw: Any) -> tuple[str, dict]:
        """A credential call to `url` (default: the current URL); the URL that answered and its answer.
        A 401 re-registers once with the bootstrap token and retries."""
        target = url or self.url
        try:
            credential = await self._credential()  # may register, and fail over doing so
            target = url or self.url
            try:
                answer = await self._request(target, method, path, credential, timeout, **kw)
            except Unauthorized:
                log.warning("credential refused; registering again")
                self.registered = False
                answer = await self._request(target, method, path, await self._credential(stale=credential), timeout, **kw)
        except CALL_ERRORS as e:
            self._failed(describe(e, target))
            raise
        if self.error or self._logged:
            log.info("control plane %s answers again", target)
        self.registered, self.error = True, ""
        self._logged.clear()
        return target, answer

    async def call(self, method: str, path: str, timeout: float = REQUEST_TIMEOUT, **kw: Any) -> dict:
        return (await self._call(method, path, timeout, **kw))[1]

    def _failed(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.warning("%s", message)
        self.error = message

    async def desired(self, version: str, wait: int = LONG_POLL_WAIT) -> dict:
        """GET /v1/agent/desired: at once when the daemon's version is not `version`, else after a change or `wait` s."""
        url, answer = await self._call("GET", "/v1/agent/desired", wait + REQUEST_TIMEOUT,
                                       params={"version": version, "wait": str(wait)})
        if answer.get("version") is None:
            error = ControlPlaneError("desired state answer has no version")
            self._failed(describe(error))
            raise error
        self.desired_from = url
        return answer

    async def announce_reboot(self) -> dict:
        """POST /v1/agent/shutdown: the host is going down for a reboot (a planned absence). Each
        replica is tried once: there is no later to retry in."""
        for attempt in range(len(self.urls)):
            try:
                return await self.call("POST", "/v1/agent/shutdown", 3.0, json={"reason": "reboot"})
            except CALL_ERRORS as e:
                if not fails_over(e) or attempt == len(self.urls) - 1:
                    raise
        raise AssertionError("unreachable")

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
        if report.get("usage") is not None:  # every heartbeat: not part of the digest
            body["usage"] = report["usage"]
        hinted = self.heartbeat_to
        try:
            try:
                _, answer = await self._call("POST", "/v1/agent/heartbeat", self._beat_timeout(hinted is not None),
                                             url=hinted, json=body)
            except CALL_ERRORS as e:
                if hinted is None or not fails_over(e):
                    raise
                # The health-checking replica is gone (the hint is dropped): the list, at once.
                _, answer = await self._call("POST", "/v1/agent/heartbeat", self._beat_timeout(False), json=body)
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
        timeout = answer.get("timeout")
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
            self.heartbeat_timeout = float(timeout)
        self._follow(answer.get("heartbeat_to"))

    def _beat_timeout(self, hinted: bool) -> float:
        """How long a heartbeat call waits for its answer: half the region's heartbeat timeout when
        another replica could answer instead (the list's, after a hint; the next of a list of
        several), never under the heartbeat interval nor MIN_BEAT_WAIT; else REQUEST_TIMEOUT (with
        nowhere else to go, a late answer is still the best there is)."""
        if self.heartbeat_timeout is None or not (hinted or len(self.urls) > 1):
            return REQUEST_TIMEOUT
        return min(REQUEST_TIMEOUT, max(self.interval, MIN_BEAT_WAIT, self.heartbeat_timeout / 2))

    def _follow(self, hint: object) -> None:
        """The heartbeat answer's `heartbeat_to`, when present: where the following heartbeats go."""
        if hint is None:
            return
        parts = urlsplit(hint) if isinstance(hint, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc \
                or (parts.scheme == "http" and self.url.startswith("https:")):
            if repr(hint) != self._bad_hint:
                self._bad_hint = repr(hint)
                log.warning("ignoring heartbeat_to %r: not an http(s) URL, or a downgrade from https", hint)
            return
        target = None if hint.rstrip("/") == self.url else hint.rstrip("/")
        if target is not None and time.monotonic() - self._unanswered.get(target, -HINT_PAUSE) < HINT_PAUSE:
            return  # it failed a moment ago: the list's replica relays meanwhile
        if target != self.heartbeat_to:
            log.info("heartbeats go to %s (the replica that checks this machine's health)", target or self.url)
            self.heartbeat_to = target

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
                desired = DesiredState.from_json(data, self.client.desired_from, version=version)
            except DesiredStateError as e:
                log.error("rejected desired state %s: %s", version, e)
                rejected = str(e)
                on_error(rejected)
                continue
            rejected = ""
            await on_change(desired)
