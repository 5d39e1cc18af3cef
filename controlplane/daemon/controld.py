"""`twine-controld`: the regional control daemon, its components wired together.

start: connect to etcd, rebuild the in-memory view of the region (range read + watch), serve the
API; run: the scheduler shards this process wins, the health check service; stop (SIGTERM/SIGINT):
close the API and the loops. Nothing lives only in this process but heartbeat times and agents'
task reports, which the agents resend: a daemon killed with SIGKILL and restarted restarts no task
and loses none.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from agent.listener import ConnLimits, Listener
from agent.sdnotify import Notifier
from controlplane.broker.agents import MAX_LONG_POLLS, MAX_WAIT, AgentService, BootstrapFile
from controlplane.daemon.intake import Intake
from controlplane.broker.relay import Relay
from controlplane.capacity.metrics import CapacityCollector
from controlplane.capacity.recorder import CapacityRecorder
from controlplane.coordination.coordinator import ROLES, Coordinator, parse_shards
from controlplane.daemon import metrics
from controlplane.daemon.shards import ShardHost
from controlplane.daemon.stalls import Stalls
from controlplane.frontend.app import make_app
from controlplane.frontend.forward import Forwarder
from controlplane.frontend.services import Services, Settings as FrontendSettings
from controlplane.health.check import HealthService
from controlplane.opsplanner.planner import OpsPlanner
from controlplane.scheduler.lifecycle import LifecycleMetrics
from controlplane.scheduler.ratelimit import Limits
from controlplane.security.sealing import Sealer
from controlplane.sidekick.documents import ProfileDocuments
from controlplane.store import Conflict, Store, Versioned
from controlplane.store.keys import Keys
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach
from controlplane.usage.metrics import UsageCollector
from controlplane.usage.peers import PeerTasks
from controlplane.srm.metrics import SrmCollector
from controlplane.usage.recorder import SAMPLE, Recorder
from controlplane.srm.load import Loads
from controlplane.srm.service import INTERVAL as SRM_INTERVAL, Autoscaler
from controlplane.rebalancer.rounds import INTERVAL as REBALANCE_INTERVAL, Continuous
from controlplane.rollouts.driver import INTERVAL as ROLLOUT_INTERVAL
from controlplane.usage.region import RegionUsage

log = logging.getLogger("twine.controld")


@dataclass(frozen=True)
class DaemonSettings:
    """Everything a daemon is told but its credentials (main.py makes it from the flags)."""

    region: str = "region1"
    heartbeat_timeout: float = 5.0  # seconds without a heartbeat before a machine is unhealthy
    heartbeat_interval: float = 1.0  # told to agents
    profile_search: tuple[Path, ...] | None = None  # where entitlements' profiles are loaded from
    limits: Limits = Limits()  # the destructive rate limits
    taskcontrol_interval: float = 1.0
    maintenance_policy: str = "move"  # for jobs without a TaskController, unless a maintenance names one
    reboot_grace: float = 300.0
    roles: tuple[str, ...] = ROLES
    shards: str = "all"  # the scheduler shards this process may lead
    shard_count: int = 1  # the region's, when this daemon is its first
    lease_ttl: int = 2
    advertise: str = ""  # this process's URL as others reach it
    member_id: str | None = None
    max_txn_ops: int = 128
    conn_limits: ConnLimits = field(default_factory=ConnLimits)
    max_long_polls: int = MAX_LONG_POLLS
    max_long_poll: float = MAX_WAIT
    usage_sample: float = SAMPLE  # seconds between two samples of the usage history
    srm_interval: float = SRM_INTERVAL  # seconds between two passes of the SRM (autoscaling)
    rebalance_interval: float = REBALANCE_INTERVAL  # seconds between two rounds of the ReBalancer's continuous mode
    rollout_interval: float = ROLLOUT_INTERVAL  # seconds between two steps of the profile rollouts (a shard's leader)
    prometheus_url: str | None = None  # the region's Prometheus server, for autoscale metrics that query it


class ControlDaemon:
    def __init__(self, store: Store, settings: DaemonSettings, api_tokens: set[str],
                 bootstrap_tokens: "set[str] | BootstrapFile", tls: ssl.SSLContext | None = None,
                 client_tls: ssl.SSLContext | None = None, sealer: Sealer | None = None,
                 intake: Intake | None = None):
        s = self.settings = settings
        self.store = store
        self.keys = Keys(s.region)
        self.api_tokens = api_tokens
        self.tls = tls  # served over TLS when set
        self.client_tls = client_tls  # how this process verifies the other replicas (None: the system's CAs)
        self.listener: Listener | None = None
        self.state = RegionState(store, self.keys, ProfileDocuments(s.profile_search))
        if sealer is not None:  # --secret-key-file: secret task values sealed at rest
            self.state.sealer = sealer
        self.agents = AgentService(self.state, store, self.keys, bootstrap_tokens, s.heartbeat_interval,
                                   reboot_grace=s.reboot_grace, max_long_polls=s.max_long_polls,
                                   max_wait=s.max_long_poll, heartbeat_timeout=s.heartbeat_timeout)
        self.health = HealthService(self.state, store, self.keys, self.agents.last_seen, s.heartbeat_timeout,
                                    max_txn_ops=s.max_txn_ops)
        self.agents.on_seen = self.health.seen
        self.agents.on_report = self.health.reported
        self.health.report_of = self.agents.report_with_time
        self.intake = intake or Intake()  # (made with its loop, or none: the horizon is always now)
        self.health.heard.intake = self.intake.horizon
        self.registry = metrics.registry()
        # the control plane's own hosts, where no TaskController may be: its members' and etcd's
        self.reach = Reach(lambda: [*(urlsplit(m.get("url", "")).hostname or "" for m in self.state.members.values()),
                                    *(host for host, _ in store.endpoints)])
        self.shards = ShardHost(self.state, store, self.agents, LifecycleMetrics(self.registry), s.limits,
                                s.taskcontrol_interval, s.maintenance_policy, s.max_txn_ops, self.reach,
                                s.rollout_interval)
        self.registry.register(metrics.DaemonCollector(self.state, self.shards, self.agents, self.health,
                                                       lambda: (self.coordinator, self.relay, self.listener)))
        self.ops = OpsPlanner(self.state, s.maintenance_policy)
        self.usage = RegionUsage(self.agents.usage)
        self.recorder = Recorder(self.state, store, self.usage, lambda: self.shards.schedulers.keys(),
                                 s.usage_sample, max_txn_ops=s.max_txn_ops) if "scheduler" in s.roles else None
        self.srm = Autoscaler(self.state, self.usage, self.shards, self.recorder, s.srm_interval, s.usage_sample,
                              Loads(self.state, s.prometheus_url, self.reach)) if "scheduler" in s.roles else None
        if self.srm is not None:
            self.registry.register(SrmCollector(self.srm))
        self.rebalancer = Continuous(self.state, self.usage, lambda: 0 in self.shards.schedulers,
                                     s.rebalance_interval) if "scheduler" in s.roles else None
        self.registry.register(UsageCollector(self.state, self.usage, self.recorder))
        # the pool's history (opportunistic capacity's SLO): kept by the leader of shard 0, read by any replica
        self.capacity = CapacityRecorder(self.state, store, lambda: 0 in self.shards.schedulers)
        self.registry.register(CapacityCollector(self.capacity))
        self.stalls = Stalls(self.registry, warn_after=s.lease_ttl / 3)
        self.coordinator: Coordinator | None = None
        self.relay: Relay | None = None
        self._http: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        """For requests to the other replicas (forwarded, relayed)."""
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.client_tls or True))
        return self._http

    async def metrics_text(self) -> bytes:
        return await metrics.scrape(self.registry)

    async def _agree_shard_count(self) -> None:
        """The region's shard count lives in etcd: the first daemon writes its --shard-count; the
        others take the region's (and say so when theirs differs)."""
        key, count = self.keys.settings(), self.settings.shard_count
        if not self.state.settings:
            try:
                rev = await self.store.commit([Versioned(key, None, 0)], {key: {"shards": count}})
            except Conflict:  # another daemon wrote it first: wait until our view has theirs
                rev = (await self.store.read(key)).mod_revision
            await self.state.wait_for(rev)
        if self.state.shard_count != count:
            log.warning("region %s has %d shard(s); --shard-count %d is not used (the region's setting wins)",
                        self.keys.region, self.state.shard_count, count)

    def _start_replication(self, host: str, port: int) -> None:
        """This process as a member of the region's replicas: its coordinator (membership, shard
        elections, health ownership) and its relay to the others."""
        s = self.settings
        shards = parse_shards(s.shards, self.state.shard_count)
        scheme = "https" if self.tls is not None else "http"
        url = s.advertise or f"{scheme}://{host if host not in ('0.0.0.0', '::', '') else '127.0.0.1'}:{port}"
        self.coordinator = Coordinator(self.store, self.keys, self.state, url, s.roles, shards, self.shards.lead,
                                       self.shards.depose, ttl=s.lease_ttl, member_id=s.member_id)
        self.relay = Relay(self.state, self.agents, self.health, self.coordinator, self.http, min(self.api_tokens),
                           usage=self.usage)
        self.usage.peer_tasks = PeerTasks(self.coordinator, self.http, min(self.api_tokens))  # each task's figures
        self.health.coordinator = self.agents.coordinator = self.coordinator
        self.agents.relay = self.relay
        self.relay.behind = self.intake.behind

    def _app(self) -> web.Application:
        s = self.settings
        return make_app(Services(
            settings=FrontendSettings(s.region, s.roles, self.api_tokens, s.conn_limits.body_timeout,
                                      s.profile_search),
            state=self.state, shards=self.shards, agents=self.agents, ops=self.ops, clean=self.health.clean,
            forwarder=Forwarder(self.coordinator, self.http), coordinator=self.coordinator, relay=self.relay,
            reach=self.reach, metrics=self.metrics_text, usage=self.usage, recorder=self.recorder,
            srm=self.srm, capacity=self.capacity, prometheus_url=s.prometheus_url))

    async def run(self, host: str, port: int, stop: asyncio.Event, notifier: Notifier | None = None) -> None:
        s = self.settings
        notifier = notifier or Notifier()
        await self.state.start()
        jobs = self.state.jobs.values()
        unknown = self.state.sealer.unknown_keys((j.task for j in jobs), (j.controller_token for j in jobs))
        if unknown:
            log.error("secret task values sealed with key(s) not in --secret-key-file: %s; the machines that run "
                      "their tasks get 503 from this replica (their tasks keep running) until the key is listed or "
                      "the values are sent again", ", ".join(f"{k} ({n} value(s))" for k, n in sorted(unknown.items())))
        if "scheduler" in s.roles:
            # the allocator's first snapshot, built from every record (about 15 s at a million
            # machines), before this process holds a lease: built at its first leadership, it kept
            # the event loop from the lease's keep-alive for longer than the lease lasts
            self.state.snapshot()
        await self._agree_shard_count()
        self._start_replication(host, port)
        runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=2.0, **s.conn_limits.runner_kwargs())
        await runner.setup()
        try:
            self.listener = await Listener(runner, s.conn_limits).start(host, port, self.tls)
            log.info("twine-controld for region %s listening on %s:%d (member %s, roles %s, shards %s of %d)",
                     self.keys.region, host, port, self.coordinator.id, ",".join(s.roles),
                     s.shards, self.state.shard_count)
            notifier.ready(f"region {self.keys.region}: {len(self.state.machines)} machines, {len(self.state.jobs)} jobs")
            async with asyncio.TaskGroup() as tg:
                loops = [tg.create_task(self.coordinator.run()), tg.create_task(self.relay.run()),
                         tg.create_task(self.state.index.watching()), tg.create_task(notifier.watchdog_loop()),
                         tg.create_task(self.stalls.run())]
                if "health" in s.roles:
                    loops.append(tg.create_task(self.health.run()))
                if self.recorder is not None:
                    loops.append(tg.create_task(self.recorder.run()))
                if self.srm is not None:
                    loops.append(tg.create_task(self.srm.run()))
                    loops.append(tg.create_task(self.capacity.run()))
                if self.rebalancer is not None:
                    loops.append(tg.create_task(self.rebalancer.run()))
                await stop.wait()
                self.agents.closing.set()
                await self.coordinator.resign()
                for t in loops:
                    t.cancel()
        finally:
            await self.shards.stop()
            if self.listener is not None:
                await self.listener.stop()
            await runner.cleanup()
            if self._http is not None:
                await self._http.close()
            if self.srm is not None:
                await self.srm.loads.close()
            await self.state.stop()
