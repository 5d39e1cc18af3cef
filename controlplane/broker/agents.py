"""The agents' side of the daemon (the resource broker's registration, desired state, heartbeats).

- register: a bootstrap token admits a machine; it gets a per-machine credential, of which etcd
  keeps only the sha256. Labels and capacity are (re)written; entitlement and tasks are kept.
- desired: a long poll. The answer is the machine's desired state (state.desired_for) as soon as
  its version differs from the one the agent has.
- heartbeat: kept in memory (time seen, the digest and the task report). etcd is written only when
  something the control plane keeps changes (the applied profile); a heartbeat whose digest is
  unchanged costs a dict lookup. After a daemon restart the reports are empty and agents are asked
  to resend theirs in full.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
import time
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Protocol

from controlplane.broker.reboots import Reboots
from controlplane.store.digest import NO_DIGEST, Digest
from controlplane.store.records import ApiError, MachineRec
from controlplane.security.sealing import SealingError
from controlplane.security.secretfile import owner_only, tokens_in
from controlplane.store.state import RegionState
from controlplane.store import Store
from controlplane.store.keys import Keys
from controlplane.usage.book import UsageBook, cell_of

if TYPE_CHECKING:
    from controlplane.coordination.coordinator import Coordinator

log = logging.getLogger("twine.controld.agents")
# the report of a machine that runs no task: one read-only mapping for all of them, not an empty dict
# each (every replica holds every machine's report, issue #38)
NO_TASKS: "MappingProxyType[tuple[str, int], dict]" = MappingProxyType({})
MACHINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$(?!\n)")  # the end of the text (agent/models.py)
LABELS = ("region", "dc", "msb", "rack", "machine_type")
MAX_WAIT = 60.0  # seconds a desired-state long poll waits at most (--max-long-poll)
MAX_LONG_POLLS = 20000  # desired-state long polls parked at once in one process (--max-long-polls)


CREDENTIAL_HEADER = "X-Twine-Credential"  # a registering agent's current credential
MAX_LABEL = 253  # characters of a label value, hostname, address or agent version (a DNS name's length)
# The bodies agents send (register, heartbeat, shutdown) are checked against their schema
# (controlplane/frontend/schema.py: AgentRegister, Heartbeat, Shutdown) before they reach this module.


def sha256(text: str) -> str:
    # surrogateescape: a header's bytes that are not UTF-8 hash as they came (no 500 for them)
    return hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()


class Relaying(Protocol):
    """What the heartbeat path tells the relay to the other replicas (relay.py)."""

    def heard(self, mid: str) -> None:
        """A heartbeat: its machine's health owner, if another member, hears of it."""

    def reported(self, mid: str) -> None:
        """The machine's task report (or error) changed here: every other member gets it."""


class BootstrapFile:
    """The tokens of --bootstrap-token-file. They expire `ttl` seconds after the file was last
    written (Kubernetes' bootstrap tokens expire: one copied off a host long ago registers
    nothing); ttl 0 is an operator's explicit "never". The file is read again when it changes, so
    an operator renews them by writing it anew, without a restart. A file that turns unreadable,
    readable by others, empty, or holds an API token admits nothing until it is mended. At start
    the same faults are a ValueError (the daemon exits 2)."""

    def __init__(self, path: str | None, ttl: float, api_tokens: set[str] = frozenset()):
        self.path, self.ttl = path, ttl
        self._api = {sha256(t) for t in api_tokens}
        self._said = ""
        self._seen, self._mtime, self._hashes = self._read() if path else (None, time.time(), set())

    @classmethod
    def of(cls, tokens: set[str]) -> "BootstrapFile":
        """Tokens given as they are (no file): they never expire."""
        out = cls(None, 0)
        out._hashes = {sha256(t) for t in tokens}
        return out

    def _read(self) -> tuple[tuple, float, set[str]]:
        """What tells a change of the file (taken before it is read: a write after it is seen at
        the next look), when it was last written, and its tokens' hashes. ValueError: a fault."""
        st = owner_only(self.path, "tokens")
        seen = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        hashes = {sha256(t) for t in tokens_in(self.path)}
        if hashes & self._api:
            raise ValueError(f"{self.path}: a token in it is in --api-token-file too: an agent's host would hold an "
                             "admin token; give agents tokens of their own")
        return seen, st.st_mtime, hashes

    def _say(self, level: int, text: str) -> None:
        if text != self._said:
            log.log(level, "%s", text)
        self._said = text

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        except OSError:
            seen = None
        if seen == self._seen:
            return
        try:
            self._seen, self._mtime, self._hashes = self._read()
        except ValueError as e:
            self._seen, self._hashes = seen, set()
            self._say(logging.ERROR, f"--bootstrap-token-file {e}; its tokens register nothing until it is mended")
            return
        self._said = ""
        log.warning("--bootstrap-token-file %s read again: %d token(s), valid until %s", self.path,
                    len(self._hashes), self.expiry_text())

    def expires_at(self) -> float | None:
        return self._mtime + self.ttl if self.ttl else None

    def expiry_text(self) -> str:
        at = self.expires_at()
        return "revoked (no expiry: --bootstrap-token-ttl 0)" if at is None else \
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))

    def admits(self, token: str) -> bool:
        if self.path:
            self._reload()
        if sha256(token) not in self._hashes:
            return False
        at = self.expires_at()
        if at is not None and time.time() >= at:
            self._say(logging.WARNING, f"a token of --bootstrap-token-file {self.path} was refused: the file's tokens "
                                       f"expired at {self.expiry_text()} (--bootstrap-token-ttl {self.ttl:g}s after "
                                       "it was written); write new tokens into it, or make one with "
                                       "`twinectl token create --role bootstrap`")
            return False
        return True


class AgentService:
    def __init__(self, state: RegionState, store: Store, keys: Keys, bootstrap_tokens: "set[str] | BootstrapFile",
                 heartbeat_interval: float = 1.0, on_seen: Callable[[str], None] | None = None,
                 reboot_grace: float = 300.0, max_long_polls: int = MAX_LONG_POLLS, max_wait: float = MAX_WAIT,
                 heartbeat_timeout: float | None = None):
        self.state = state
        self.max_long_polls = max_long_polls  # desired-state long polls parked at once in this process
        self.max_wait = max_wait  # seconds one waits at most
        self.parked = 0
        self.store = store
        self.keys = keys
        self.bootstrap = bootstrap_tokens if isinstance(bootstrap_tokens, BootstrapFile) \
            else BootstrapFile.of(set(bootstrap_tokens))
        self.heartbeat_interval = heartbeat_interval
        # told to agents with the interval: how long a heartbeat call may wait for a replica
        self._pace = {"interval": heartbeat_interval,
                      **({} if heartbeat_timeout is None else {"timeout": heartbeat_timeout})}
        self.on_seen = on_seen
        self.on_report: Callable[[str], None] | None = None  # the machine's task report changed
        self.last_seen: dict[str, float] = {}  # machine id -> monotonic time of its last heartbeat
        self.last_seen_wall: dict[str, float] = {}
        self.reports: dict[str, dict[tuple[str, int], dict]] = {}
        self.report_at: dict[str, float] = {}  # machine -> when its report was last known current (wall clock)
        self.digests: dict[str, str] = {}
        self.errors: dict[str, str] = {}  # machine id -> why its agent rejected its desired state
        self._unopened: dict[str, str] = {}  # machine id -> the secret its desired state could not open (said once)
        self.counters = {"heartbeats": 0, "heartbeat_reports": 0, "registrations": 0, "long_polls": 0,
                         "long_polls_refused": 0, "usage_refused": 0}
        self.closing = asyncio.Event()  # set at shutdown: long polls answer at once
        self.reboots = Reboots(state, store, keys, reboot_grace)
        # what the machines heartbeating here use (controlplane/usage/): a machine whose heartbeats
        # went elsewhere leaves it after a few intervals
        self.usage = UsageBook(stale=3 * heartbeat_interval + 1)
        # replicas (set by the daemon once it runs): heartbeats and reports other members need go
        # through the relay; the coordinator says which member judges each machine's health
        self.relay: Relaying | None = None
        self.coordinator: "Coordinator | None" = None

    def _hint(self, mid: str) -> dict:
        """The heartbeat answer's `heartbeat_to`: the replica that owns the machine's health check,
        when it is another one."""
        coord = self.coordinator
        if coord is None:
            return {}
        owner = coord.owner_of(mid)
        if owner is None or owner == coord.id:
            return {}
        url = coord.member_url(owner)
        return {"heartbeat_to": url} if url else {}

    # -- authentication ----------------------------------------------------------------------

    def is_bootstrap(self, token: str) -> bool:
        """A token of --bootstrap-token-file, not expired."""
        return self.bootstrap.admits(token)

    def machine_of(self, credential: str) -> str | None:
        return self.state.credentials.get(Digest.of(credential))

    # -- registration ------------------------------------------------------------------------

    async def register(self, body: dict, current: str | None = None) -> dict:
        """Register a machine with the bootstrap token (checked by the caller). A machine id that
        exists is taken again only with its current credential (`current`, the agent's
        X-Twine-Credential header) or after an admin released it: a bootstrap token cannot take a
        live machine over (its credential, its desired state, its labels). Labels and capacity do
        not change under placed tasks: drain the machine, or release it."""
        mid, labels, cap = body["machine_id"], body["labels"], body["capacity"]  # as the schema has them
        if labels["region"] != self.keys.region:
            raise ApiError("unprocessable", "labels.region", f"{labels['region']!r}: this control plane serves region "
                           f"{self.keys.region!r}")
        credential = secrets.token_urlsafe(32)
        fields = dict(hostname=str(body.get("hostname") or mid), labels={k: labels[k] for k in LABELS},
                      capacity=dict(cap), address=str(body.get("address") or ""),
                      agent_version=str(body.get("version") or ""), credential_sha256=Digest.of(credential))
        key = self.keys.machine(mid)

        def compute(reads):
            old = reads[key].value
            if not old:
                return {key: MachineRec(id=mid, registered_at=time.time(), **fields).to_json()}, []
            rec = MachineRec.from_json(old)
            released = not rec.credential_sha256
            if not released and (current is None or not hmac.compare_digest(Digest.of(current), rec.credential_sha256)):
                raise ApiError("exists", "machine_id", f"machine {mid} is registered; registering it again takes its "
                               f"current credential (header {CREDENTIAL_HEADER}), or an admin's release "
                               f"(twinectl machine release {mid})")
            placed = self.state.allocated(mid)[0]  # (its tasks' and tombstones', as this view has them)
            if placed and not released:
                for f in ("labels", "capacity"):
                    was, now = getattr(rec, f), fields[f]
                    changed = was != now if f == "labels" else \
                        (was.get("cpus"), was.get("memory_mb")) != (now.get("cpus"), now.get("memory_mb"))
                    if changed:
                        raise ApiError("conflict", f, f"machine {mid} has {placed} task(s) placed on it: its "
                                       f"{f} do not change under them; drain it, or have an admin release it")
            return {key: replace(rec, **fields).to_json()}, []

        rev = await self.store.update([key], compute)
        await self.state.wait_for(rev)
        self.counters["registrations"] += 1
        self.reports.pop(mid, None)
        self.digests.pop(mid, None)
        log.info("machine %s registered (%s/%s/%s/%s)", mid, labels["dc"], labels["msb"], labels["rack"],
                 labels["machine_type"])
        return {"machine_id": mid, "credential": credential}

    async def release(self, mid: str) -> None:
        """An admin's release: the machine's credential no longer holds, and the next registration
        with a bootstrap token takes the machine id (a reinstalled host that lost its credential)."""
        key = self.keys.machine(mid)

        def compute(reads):
            old = reads[key].value
            if not old:
                raise ApiError("not_found", "machine", f"no machine {mid!r}")
            return {key: replace(MachineRec.from_json(old), credential_sha256=NO_DIGEST).to_json()}, []

        await self.state.wait_for(await self.store.update([key], compute))
        log.warning("machine %s released: its credential no longer holds; a bootstrap token may register it", mid)

    # -- desired state (long poll) -----------------------------------------------------------

    def _desired(self, mid: str) -> dict:
        try:
            d = self.state.desired_for(mid)
            self._unopened.pop(mid, None)  # said again if it comes back
            return d
        except SealingError as e:
            # 503: the agent keeps what runs and asks again (another replica, whose key file may
            # hold the key); neither runs a task without its secret nor stops one for this key
            if self._unopened.get(mid) != str(e):
                log.error("machine %s: its desired state cannot be made here: %s", mid, e)
            self._unopened[mid] = str(e)
            raise ApiError("unavailable", None, f"this replica cannot open a secret value of this machine's tasks "
                           f"({e}); the tasks keep running") from None

    async def desired(self, mid: str, version: str, wait: float) -> dict:
        """The machine's desired state: at once when it differs from `version`, else when it
        changes or `wait` seconds have passed. At most max_long_polls wait at once; another is a
        503 (an agent then tries the next replica, or again after a pause)."""
        self.counters["long_polls"] += 1
        deadline = time.monotonic() + max(0.0, min(wait, self.max_wait))
        changed = self.state.machine_changed(mid)  # taken before the state is read: no change is missed
        d = self._desired(mid)
        if d["version"] != version or wait <= 0 or self.closing.is_set():
            return d
        if self.parked >= self.max_long_polls:
            self.counters["long_polls_refused"] += 1
            raise ApiError("unavailable", "wait", f"{self.parked} long polls wait here already, the limit "
                           "(--max-long-polls): try another replica, or again shortly")
        self.parked += 1
        try:
            while (left := deadline - time.monotonic()) > 0 and not self.closing.is_set():
                waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(self.closing.wait())]
                try:
                    await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                changed = self.state.machine_changed(mid)
                d = self._desired(mid)
                if d["version"] != version:
                    break
            return d
        finally:
            self.parked -= 1

    # -- heartbeats --------------------------------------------------------------------------

    async def heartbeat(self, mid: str, body: dict) -> dict:
        """A heartbeat (its body checked against schema.Heartbeat: tasks name their job and index)."""
        self.counters["heartbeats"] += 1
        self.last_seen[mid] = time.monotonic()
        self.last_seen_wall[mid] = time.time()
        try:
            return await self._heard(mid, body)
        finally:
            # after the report and its time are taken: the health check judges by this heartbeat's
            # report (a tombstone it no longer lists goes now, not a heartbeat later)
            if self.on_seen is not None:
                self.on_seen(mid)

    async def _heard(self, mid: str, body: dict) -> dict:
        relay = self.relay
        if relay is not None:
            relay.heard(mid)
        await self.reboots.seen(mid)
        if (usage := body.get("usage")) is not None and (m := self.state.machines.get(mid)) is not None:
            # (the record's id: the string the region holds already, not the request's, kept a machine)
            self.usage.note(m.id, cell_of(m), usage, self.state.jobs, time.monotonic())
        error = str(body.get("desired_error") or "")
        if error != self.errors.get(mid, ""):
            self.errors[mid] = error
            self.state.changed.set(self.state.jobs_on(mid))
            if relay is not None:
                relay.reported(mid)
        digest = body.get("digest")
        tasks = body.get("tasks")
        hint = self._hint(mid)
        if tasks is None:
            if digest != self.digests.get(mid):
                return {"ok": True, "resend": True, **self._pace, **hint}
            self.report_at[mid] = time.time()  # the agent's report is the one kept here, as of now
            return {"ok": True, **self._pace, **hint}
        report = {(t["job"], t["index"]): t for t in tasks} if tasks else NO_TASKS
        profile = body.get("profile") or {}
        self.counters["heartbeat_reports"] += 1
        # one string for a digest many machines share (that of a profile and no task), not one each
        self.digests[mid] = sys.intern(digest) if type(digest) is str else digest
        self.report_at[mid] = time.time()
        if report != self.reports.get(mid):
            self.reports[mid] = report
            self.state.changed.set(self.state.jobs_on(mid) | {job for job, _ in report})
            if relay is not None:
                relay.reported(mid)
            if self.on_report is not None:
                self.on_report(mid)
        await self._profile(mid, profile)
        return {"ok": True, **self._pace, **hint}

    async def _profile(self, mid: str, profile: dict) -> None:
        """Record the profile the agent reports applied, when it differs from what etcd has: the
        sidekick's gate (tasks start only on a machine whose profile is applied)."""
        m = self.state.machines.get(mid)
        applied, digest = profile.get("name") or None, profile.get("hash") or None
        ok = bool(profile.get("ok", True))
        error = str(profile.get("error") or "")
        if m is None or (m.profile_applied, m.profile_hash, m.profile_ok, m.profile_error) == (applied, digest, ok, error):
            return
        key = self.keys.machine(mid)

        def compute(reads):
            cur = MachineRec.from_json(reads[key].value)
            return {key: replace(cur, profile_applied=applied, profile_hash=digest, profile_ok=ok,
                                            profile_error=error).to_json()}, []

        rev = await self.store.update([key], compute)
        await self.state.wait_for(rev)
        log.info("machine %s reports profile %s %s", mid, applied, "applied" if ok else f"failed: {error}")

    def error_of(self, mid: str) -> str:
        """Why the machine's agent rejected its desired state ("" if it did not)."""
        return self.errors.get(mid, "")

    def last_heartbeat(self, mid: str) -> float | None:
        """When this process last heard the machine's agent (wall clock)."""
        return self.last_seen_wall.get(mid)

    def report_of(self, mid: str) -> dict[tuple[str, int], dict] | None:
        return self.reports.get(mid)

    def report_with_time(self, mid: str) -> tuple[dict[tuple[str, int], dict] | None, float | None]:
        """The machine's report and when it was last known current (wall clock), for its tombstones."""
        return self.reports.get(mid), self.report_at.get(mid)
