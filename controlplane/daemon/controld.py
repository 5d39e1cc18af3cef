"""`twine-controld`: the regional control daemon.

start: connect to etcd, rebuild the in-memory view of the region (range read + watch), serve the
API; run: the scheduler, the health check service; stop (SIGTERM/SIGINT): close the API and the
loops. Nothing lives only in this process but heartbeat times and agents' task reports, which the
agents resend: a daemon killed with SIGKILL and restarted restarts no task and loses none.

Exit codes: 0 stopped, 2 bad input (flags, token files), 3 etcd or the listen address unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from agent import tls as tls_files
from agent.errors import InputError
from agent.listener import ConnLimits, Listener
from agent.sdnotify import Notifier
from controlplane.daemon import config as daemon_config
from controlplane.broker.agents import MAX_LONG_POLLS, MAX_WAIT, AgentService, BootstrapFile
from controlplane.broker.relay import Relay
from controlplane.security.sealing import Sealer
from controlplane.security.secretfile import owner_only, tokens_in
from controlplane.scheduler.lifecycle import LifecycleMetrics
from controlplane.coordination.coordinator import ROLES, Coordinator, Fence, parse_roles, parse_shards
from controlplane.frontend.app import make_app
from controlplane.health.check import HealthService
from controlplane.scheduler.ratelimit import Limits
from controlplane.scheduler.service import Scheduler
from controlplane.sidekick.documents import ProfileDocuments
from controlplane.daemon.stalls import Stalls, tune_collector
from controlplane.store.state import RegionState
from controlplane.store import Conflict, EtcdTls, Store, Versioned
from controlplane.store.keys import Keys

log = logging.getLogger("twine.controld")
EXIT_OK, EXIT_INPUT, EXIT_UNAVAILABLE = 0, 2, 3


class ControlDaemon:
    def __init__(self, store: Store, region: str, api_tokens: set[str], bootstrap_tokens: "set[str] | BootstrapFile",
                 heartbeat_timeout: float = 5.0, heartbeat_interval: float = 1.0,
                 profile_search: tuple[Path, ...] | None = None, limits: Limits = Limits(),
                 taskcontrol_interval: float = 1.0, maintenance_policy: str = "move", reboot_grace: float = 300.0,
                 roles: tuple[str, ...] = ROLES, shards: str = "all", shard_count: int = 1, lease_ttl: int = 2,
                 advertise: str = "", member_id: str | None = None, max_txn_ops: int = 128,
                 conn_limits: ConnLimits = ConnLimits(), tls: ssl.SSLContext | None = None,
                 client_tls: ssl.SSLContext | None = None, max_long_polls: int = MAX_LONG_POLLS,
                 sealer: Sealer | None = None, max_long_poll: float = MAX_WAIT):
        self.store = store
        self.keys = Keys(region)
        self.api_tokens = api_tokens
        self.profile_search = profile_search
        self.limits = limits
        self.taskcontrol_interval = taskcontrol_interval
        self.maintenance_policy = maintenance_policy
        self.roles = roles
        self.shards_spec = shards
        self.shard_count = shard_count
        self.lease_ttl = lease_ttl
        self.advertise = advertise
        self.member_id = member_id
        self.max_txn_ops = max_txn_ops
        self.conn_limits = conn_limits
        self.tls = tls  # served over TLS when set
        self.client_tls = client_tls  # how this process verifies the other replicas (None: the system's CAs)
        self.listener: Listener | None = None
        self.state = RegionState(store, self.keys, ProfileDocuments(profile_search))
        if sealer is not None:  # --secret-key-file: secret task values sealed at rest
            self.state.sealer = sealer
        self.agents = AgentService(self.state, store, self.keys, bootstrap_tokens, heartbeat_interval,
                                   reboot_grace=reboot_grace, max_long_polls=max_long_polls, max_wait=max_long_poll)
        self.health = HealthService(self.state, store, self.keys, self.agents.last_seen, heartbeat_timeout,
                                    max_txn_ops=max_txn_ops)
        self.agents.on_seen = self.health.seen
        self.agents.on_report = self.health.reported
        self.health.report_of = self.agents.report_with_time
        self.agents.daemon = self
        self.schedulers: dict[int, Scheduler] = {}  # the shards this process leads now
        self._loops: dict[int, asyncio.Task] = {}
        self.registry = CollectorRegistry(auto_describe=True)  # this daemon's (tests run several in one process)
        self.metrics = LifecycleMetrics(self.registry)  # latency histograms, across this daemon's shards
        self.stalls = Stalls(self.registry, warn_after=lease_ttl / 3)
        self.retired = {"passes": 0, "commits": 0, "conflicts": 0, "placements": 0, "errors": 0, "rate_limited": 0}
        self.coordinator: Coordinator | None = None
        self.relay: Relay | None = None
        self._http: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        """For requests forwarded to another replica."""
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.client_tls or True))
        return self._http

    # -- shards --------------------------------------------------------------------------------

    def scheduler_for(self, handle: str) -> Scheduler | None:
        """The local scheduler of the job's shard, if this process leads it."""
        shard = self.state.shard_of_job(handle)
        return None if shard is None else self.schedulers.get(shard)

    async def lead(self, fence: Fence) -> None:
        # everything up to the election is in our view before we act on it (the rate-limit
        # buckets and operations in flight the scheduler starts from, among the rest)
        await self.state.wait_for(fence.epoch)
        sched = Scheduler(self.state, self.store, self.keys, self.agents.report_of, self.agents.errors, self.limits,
                          self.taskcontrol_interval, maintenance_policy=self.maintenance_policy, shard=fence.shard,
                          fence=fence, max_txn_ops=self.max_txn_ops, metrics=self.metrics)
        self.state.snapshot()  # the allocator's index is built now, not by the first job's request
        self.schedulers[fence.shard] = sched
        self._loops[fence.shard] = asyncio.get_running_loop().create_task(sched.run())
        self.state.changed.set()

    async def depose(self, shard: int, why: str) -> None:
        sched = self.schedulers.pop(shard, None)
        loop = self._loops.pop(shard, None)
        if sched is not None:
            sched.deposed = why
            for k, v in sched.counters.items():
                self.retired[k] = self.retired.get(k, 0) + v
        if loop is not None:
            loop.cancel()
            try:
                await loop
            except BaseException:  # cancelled, or it had failed: either way it is over
                pass

    def metrics_text(self) -> str:
        lines = []
        now = time.time()
        scheds = list(self.schedulers.values())
        counters = dict(self.retired)
        for sc in scheds:
            for k, v in sc.counters.items():
                counters[k] = counters.get(k, 0) + v
        hits = sum(sc.cache.stats().hits for sc in scheds)
        misses = sum(sc.cache.stats().misses for sc in scheds)
        coord = self.coordinator.counters if self.coordinator else {}
        values = {
            **{f"twine_scheduler_{k}_total": v for k, v in counters.items()},
            **{f"twine_agents_{k}_total": v for k, v in self.agents.counters.items()},
            **{f"twine_health_{k}_total": v for k, v in self.health.counters.items()},
            **{f"twine_coordination_{k}_total": v for k, v in coord.items()},
            **({f"twine_relay_{k}_total": v for k, v in self.relay.counters.items()} if self.relay else {}),
            "twine_ratelimit_held_operations_total": counters["rate_limited"],
            "twine_shards_led": len(scheds),
            "twine_connections_open": self.listener.total if self.listener else 0,
            "twine_connections_refused_total": self.listener.refused if self.listener else 0,
            "twine_taskcontrol_sessions": sum(len(sc.sessions) for sc in scheds),
            "twine_taskcontrol_failing": sum(sc.sessions.failing() for sc in scheds),
            "twine_allocation_cache_hit_ratio": round(hits / (hits + misses), 4) if hits + misses else 0.0,
            "twine_allocation_cache_hits_total": hits,
            "twine_allocation_cache_misses_total": misses,
            "twine_records_skipped": len(self.state.skipped),
            "twine_machines": len(self.state.machines),
            "twine_machines_unhealthy": sum(1 for m in self.state.machines.values() if not m.healthy),
            # held by tasks moved off them whose containers are not reported gone (machine clean: the admin's way out)
            "twine_machines_with_tombstones": sum(1 for m in self.state.machines.values() if m.tombstones),
            "twine_machines_in_maintenance": sum(1 for mid in self.state.machines
                                                 if (e := self.state.maintenance.of(mid, now))
                                                 and e.phase(now) == "in progress"),
            "twine_machines_free": sum(1 for m in self.state.machines.values() if m.entitlement is None),
            "twine_jobs": len(self.state.jobs),
            "twine_etcd_revision": self.state.revision,
        }
        for k, v in values.items():
            lines.append(f"{k} {v}")
        return "\n".join(lines) + "\n" + generate_latest(self.registry).decode()

    async def _settle_shard_count(self) -> None:
        """The region's shard count lives in etcd: the first daemon writes its --shard-count; the
        others take the region's (and say so when theirs differs)."""
        key = self.keys.settings()
        if not self.state.settings:
            try:
                rev = await self.store.commit([Versioned(key, None, 0)], {key: {"shards": self.shard_count}})
            except Conflict:  # another daemon wrote it first: wait until our view has theirs
                rev = (await self.store.read(key)).mod_revision
            await self.state.wait_for(rev)
        if self.state.shard_count != self.shard_count:
            log.warning("region %s has %d shard(s); --shard-count %d is not used (the region's setting wins)",
                        self.keys.region, self.state.shard_count, self.shard_count)

    async def run(self, host: str, port: int, stop: asyncio.Event, notifier: Notifier | None = None) -> None:
        notifier = notifier or Notifier()
        await self.state.start()
        jobs = self.state.jobs.values()
        unknown = self.state.sealer.unknown_keys((j.task for j in jobs), (j.controller_token for j in jobs))
        if unknown:
            log.error("secret task values sealed with key(s) not in --secret-key-file: %s; the machines that run "
                      "their tasks get 503 from this replica (their tasks keep running) until the key is listed or "
                      "the values are sent again", ", ".join(f"{k} ({n} value(s))" for k, n in sorted(unknown.items())))
        if "scheduler" in self.roles:
            # the allocator's first snapshot, built from every record (about 15 s at a million
            # machines), before this process holds a lease: built at its first leadership, it kept
            # the event loop from the lease's keep-alive for longer than the lease lasts
            self.state.snapshot()
        await self._settle_shard_count()
        shards = parse_shards(self.shards_spec, self.state.shard_count)
        runner = web.AppRunner(make_app(self), access_log=None, shutdown_timeout=2.0,
                               **self.conn_limits.runner_kwargs())
        await runner.setup()
        scheme = "https" if self.tls is not None else "http"
        url = self.advertise or f"{scheme}://{host if host not in ('0.0.0.0', '::', '') else '127.0.0.1'}:{port}"
        self.coordinator = Coordinator(self.store, self.keys, self.state, url, self.roles, shards, self.lead,
                                       self.depose, ttl=self.lease_ttl, member_id=self.member_id)
        self.relay = Relay(self)
        self.health.coordinator = self.coordinator
        try:
            self.listener = await Listener(runner, self.conn_limits).start(host, port, self.tls)
            log.info("twine-controld for region %s listening on %s:%d (member %s, roles %s, shards %s of %d)",
                     self.keys.region, host, port, self.coordinator.id, ",".join(self.roles),
                     self.shards_spec, self.state.shard_count)
            notifier.ready(f"region {self.keys.region}: {len(self.state.machines)} machines, {len(self.state.jobs)} jobs")
            async with asyncio.TaskGroup() as tg:
                loops = [tg.create_task(self.coordinator.run()), tg.create_task(self.relay.run()),
                         tg.create_task(self.state.index.watching()), tg.create_task(notifier.watchdog_loop()),
                         tg.create_task(self.stalls.run())]
                if "health" in self.roles:
                    loops.append(tg.create_task(self.health.run()))
                await stop.wait()
                self.agents.closing.set()
                await self.coordinator.resign()
                for t in loops:
                    t.cancel()
        finally:
            for shard in list(self.schedulers):
                await self.depose(shard, "stopping")
            if self.listener is not None:
                await self.listener.stop()
            await runner.cleanup()
            if self._http is not None:
                await self._http.close()
            await self.state.stop()


def _tokens(path: str | None, flag: str) -> set[str]:
    """The tokens of a file, one per line, readable by its owner only (secretfile.py)."""
    if path is None:
        raise SystemExit(_input_error(flag, "required"))
    try:
        return tokens_in(path)
    except ValueError as e:
        raise SystemExit(_input_error(flag, str(e)))


def _owner_only(path: str, flag: str, what: str) -> None:
    """Exit 2 unless `path` is readable and writable by its owner alone (as ssh's keys)."""
    try:
        owner_only(path, what)
    except ValueError as e:
        raise SystemExit(_input_error(flag, str(e)))


def _input_error(flag: str, why: str) -> int:
    print(f"twine-controld: {flag}: {why}", file=sys.stderr)
    return EXIT_INPUT


def _split_hostport(value: str, default_port: int) -> tuple[str, int]:
    """HOST:PORT, or HOST alone (the default port). ValueError names the value."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host, int(port)


def _hostport(value: str, flag: str, default_port: int) -> tuple[str, int]:
    try:
        return _split_hostport(value, default_port)
    except ValueError as e:
        raise SystemExit(_input_error(flag, str(e)))


def _ttl(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: seconds, 0 or more (0: never expire)")
    return seconds


def etcd_endpoints(value: str) -> list[tuple[str, int]]:
    """--etcd: HOST:PORT[,HOST:PORT...] (the port defaults to 2379)."""
    out = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        try:
            out.append(_split_hostport(item, 2379))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    if not out:
        raise argparse.ArgumentTypeError(f"{value!r}: no HOST:PORT")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twine-controld", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=daemon_config.DEFAULT,
                   help="TOML file of these settings (keys are the flags' names); flags override it (default %(default)s)")
    p.add_argument("--etcd", default="127.0.0.1:2379", type=etcd_endpoints,
                   help="etcd client addresses HOST:PORT[,HOST:PORT...], members of one cluster: when one does not "
                        "answer the daemon moves to the next; while none does, it keeps serving from its cache "
                        "and writes answer 503 (default %(default)s)")
    p.add_argument("--etcd-ca", help="etcd serves TLS: the CA bundle (PEM) its certificate chains to")
    p.add_argument("--etcd-cert", help="this daemon's client certificate for etcd (PEM; with etcd's "
                                       "--client-cert-auth it is the credential); needs --etcd-key")
    p.add_argument("--etcd-key", help="the private key of --etcd-cert (PEM)")
    p.add_argument("--region", default="region1", help="the region this daemon serves (default %(default)s)")
    p.add_argument("--listen", default="127.0.0.1:8080", help="API address HOST:PORT (default %(default)s)")
    p.add_argument("--api-token-file", help="operator/job owner tokens, one per line (required)")
    p.add_argument("--bootstrap-token-file",
                   help="agent bootstrap tokens, one per line; they expire --bootstrap-token-ttl after the file is "
                        "written, and the file is read again when it changes (or make tokens with "
                        "`twinectl token create --role bootstrap`)")
    p.add_argument("--secret-key-file",
                   help="keys that seal secret task environment values in etcd (AES-256-GCM), one a line, NAME:BASE64 "
                        "of 32 bytes, owner-readable only; the first seals, all open (make one: "
                        "echo key1:$(head -c 32 /dev/urandom | base64)); without it they are stored as given")
    p.add_argument("--bootstrap-token-ttl", type=_ttl, default=86400.0,
                   help="seconds the tokens of --bootstrap-token-file register machines after the file was last "
                        "written (default %(default)g: a day); 0: they never expire")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="seconds without a heartbeat before a machine is unhealthy")
    p.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between agent heartbeats (told to agents)")
    p.add_argument("--rate-limits", default="job=1:10,shard=10:100,region=20:200",
                   help="token buckets on stops and moves, SCOPE=RATE_PER_S:BURST (default %(default)s)")
    p.add_argument("--taskcontrol-interval", type=float, default=1.0,
                   help="seconds between TaskController calls while operations are pending")
    p.add_argument("--maintenance-policy", choices=("move", "stop"), default="move",
                   help="for jobs without a TaskController, unless a maintenance names its own: move their tasks "
                        "away before the deadline (max-unavailable at a time), or stop them at the deadline and "
                        "restart them on the same machine after (default %(default)s)")
    p.add_argument("--reboot-grace", type=float, default=300.0,
                   help="seconds a machine whose agent announced a clean reboot has to come back before its "
                        "tasks are placed elsewhere; meanwhile it is in maintenance, not failed (default %(default)s)")
    p.add_argument("--roles", default=",".join(ROLES),
                   help="what this process does: frontend (the API for users and agents), scheduler (campaigns to "
                        "lead shards), health (judges the heartbeats of its share of the machines); default %(default)s")
    p.add_argument("--shards", default="all", help="the scheduler shards this process may lead: all, or N,N-M (default %(default)s)")
    p.add_argument("--shard-count", type=int, default=1,
                   help="the region's number of scheduler shards, written by the first daemon of a region; "
                        "later daemons take the region's (default %(default)s)")
    p.add_argument("--lease-ttl", type=int, default=2,
                   help="seconds of the etcd lease behind this process's membership and leaderships: a dead "
                        "leader's shards are taken over after at most this long (default %(default)s)")
    p.add_argument("--max-txn-ops", type=int, default=128,
                   help="operations per etcd transaction, as etcd's --max-txn-ops allows (its default 128): a "
                        "job's changes larger than that are committed in batches (default %(default)s)")
    p.add_argument("--advertise", default="",
                   help="this process's URL as other replicas and agents reach it (default: http://LISTEN, or "
                        "https://LISTEN with --tls-cert)")
    p.add_argument("--tls-cert", help="serve the API over TLS with this certificate chain (PEM); needs --tls-key")
    p.add_argument("--tls-key", help="the private key of --tls-cert (PEM); keep it readable by this daemon only")
    p.add_argument("--tls-ca", help="CA bundle (PEM) this daemon verifies the other replicas' certificates "
                                    "against when it forwards or relays to them (default: the system's CAs)")
    p.add_argument("--max-connections-per-client", type=int, default=ConnLimits.per_client,
                   help="open connections one client address may hold; more are answered 503 (default %(default)s)")
    p.add_argument("--max-connections", type=int, default=ConnLimits.total,
                   help="open connections in all; more are answered 503 (default %(default)s)")
    p.add_argument("--max-long-polls", type=int, default=MAX_LONG_POLLS,
                   help="agents' desired-state long polls waiting at once in this process; more are answered 503 "
                        "and the agent tries another replica (default %(default)s)")
    p.add_argument("--max-long-poll", type=float, default=MAX_WAIT,
                   help="seconds an agent's desired-state long poll waits at most for a change; it may ask for "
                        "less (default %(default)s)")
    p.add_argument("--header-timeout", type=float, default=ConnLimits.header_timeout,
                   help="seconds a connection has to send a request's head (and a TLS handshake), from its "
                        "opening or its last response; then it is closed (default %(default)s)")
    p.add_argument("--body-timeout", type=float, default=ConnLimits.body_timeout,
                   help="seconds a request has to send its body; then it is answered 408 (default %(default)s)")
    p.add_argument("--profiles", action="append", default=[], help="extra profile directory for validating entitlement profiles")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


async def _main(args: argparse.Namespace) -> int:
    lhost, lport = _hostport(args.listen, "--listen", 8080)
    from agent.profiles.loader import default_search_path

    try:
        limits = Limits.parse(args.rate_limits)
    except ValueError as e:
        raise SystemExit(_input_error("--rate-limits", str(e)))
    try:
        roles = parse_roles(args.roles)
    except ValueError as e:
        raise SystemExit(_input_error("--roles", str(e)))
    try:
        parse_shards(args.shards, 10**6)  # the syntax now; the range against the region's count at start
    except ValueError as e:
        raise SystemExit(_input_error("--shards", str(e)))
    for flag, value, least, why in (("--shard-count", args.shard_count, 1, "a region has a shard at least"),
                                    ("--max-txn-ops", args.max_txn_ops, 32, "a batch holds a few tasks"),
                                    ("--lease-ttl", args.lease_ttl, 2, "etcd grants leases of 2 s or more")):
        if value < least:
            raise SystemExit(_input_error(flag, f"{value}: at least {least} ({why})"))
    for flag, value in (("--max-connections-per-client", args.max_connections_per_client),
                        ("--max-connections", args.max_connections), ("--max-long-polls", args.max_long_polls)):
        if value < 1:
            raise SystemExit(_input_error(flag, f"{value}: at least 1"))
    for flag, value in (("--header-timeout", args.header_timeout), ("--body-timeout", args.body_timeout),
                        ("--max-long-poll", args.max_long_poll)):
        if not 0 < value <= 3600:
            raise SystemExit(_input_error(flag, f"{value}: seconds, more than 0 and at most 3600"))
    conn_limits = ConnLimits(args.max_connections_per_client, args.max_connections, args.header_timeout,
                             args.body_timeout)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit(_input_error("--tls-cert/--tls-key", "give both or neither"))
    for flag, key in (("--tls-key", args.tls_key), ("--etcd-key", args.etcd_key)):
        if key:
            _owner_only(key, flag, "private keys")
    try:
        tls = tls_files.server_context(args.tls_cert, args.tls_key) if args.tls_cert else None
        client_tls = tls_files.client_context(args.tls_ca) if args.tls_ca else None
    except InputError as e:
        raise SystemExit(_input_error(e.field, f"{e.value}: {e.why}"))
    try:
        etcd_tls = EtcdTls.load(args.etcd_ca, args.etcd_cert, args.etcd_key) if args.etcd_ca else None
    except InputError as e:
        raise SystemExit(_input_error(e.field, f"{e.value}: {e.why}"))
    if etcd_tls is None and (args.etcd_cert or args.etcd_key):
        raise SystemExit(_input_error("--etcd-cert/--etcd-key", "need --etcd-ca (the CA of etcd's certificate)"))
    store = Store(args.etcd, tls=etcd_tls)
    api_tokens = _tokens(args.api_token_file, "--api-token-file")
    try:
        boot = BootstrapFile(args.bootstrap_token_file, args.bootstrap_token_ttl, api_tokens) \
            if args.bootstrap_token_file else BootstrapFile.of(set())
    except ValueError as e:
        raise SystemExit(_input_error("--bootstrap-token-file", str(e)))
    at = boot.expires_at()
    if args.bootstrap_token_file and at is not None and at <= time.time():
        log.warning("the tokens of --bootstrap-token-file %s expired at %s (--bootstrap-token-ttl %gs after it was "
                    "written): they register no machine until the file is written anew", args.bootstrap_token_file,
                    boot.expiry_text(), args.bootstrap_token_ttl)
    if args.secret_key_file:
        try:
            sealer = Sealer.load(args.secret_key_file)
        except ValueError as e:
            raise SystemExit(_input_error("--secret-key-file", str(e)))
    else:
        sealer = Sealer()
        log.warning("no --secret-key-file: secret task environment values are stored in etcd as given, in clear")
    daemon = ControlDaemon(store, args.region, api_tokens, boot,
                           args.heartbeat_timeout, args.heartbeat_interval,
                           (*map(Path, args.profiles), *default_search_path()), limits, args.taskcontrol_interval,
                           args.maintenance_policy, args.reboot_grace, roles=roles, shards=args.shards,
                           shard_count=args.shard_count, lease_ttl=args.lease_ttl, advertise=args.advertise,
                           max_txn_ops=args.max_txn_ops, conn_limits=conn_limits,
                           tls=tls, client_tls=client_tls, max_long_polls=args.max_long_polls, sealer=sealer,
                           max_long_poll=args.max_long_poll)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failed: list[BaseException] = []
    try:
        await daemon.run(lhost, lport, stop)
    except* Exception as group:  # etcd unreachable at start, the listen address taken, a bug
        failed.extend(group.exceptions)
    finally:
        await store.close()
    for e in failed:
        why = str(e)
        if "permission denied" in why or "user name not found" in why:  # etcd's auth refused our user
            why += (" (etcd's auth is on and refuses the user named by --etcd-cert's common name: "
                    "grant it the region's keys with python -m controlplane.security.etcdauth)")
        log.error("stopping: %s: %s", type(e).__name__, why)
    if failed:
        return EXIT_UNAVAILABLE
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = daemon_config.parse_args(parser(), argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_collector()
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
