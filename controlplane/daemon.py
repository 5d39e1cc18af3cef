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
import sys
import time
from pathlib import Path

from aiohttp import web

from agent.sdnotify import Notifier
from controlplane import daemon_config
from controlplane.broker.agents import AgentService
from controlplane.api.app import make_app
from controlplane.health import HealthService
from controlplane.scheduler.ratelimit import Limits
from controlplane.scheduler.service import Scheduler
from controlplane.sidekick import ProfileDocuments
from controlplane.state import RegionState
from controlplane.store import Store
from controlplane.store.keys import Keys

log = logging.getLogger("twine.controld")
EXIT_OK, EXIT_INPUT, EXIT_UNAVAILABLE = 0, 2, 3


class ControlDaemon:
    def __init__(self, store: Store, region: str, api_tokens: set[str], bootstrap_tokens: set[str],
                 heartbeat_timeout: float = 5.0, heartbeat_interval: float = 1.0,
                 profile_search: tuple[Path, ...] | None = None, limits: Limits = Limits(),
                 taskcontrol_interval: float = 1.0, maintenance_policy: str = "move", reboot_grace: float = 300.0):
        self.store = store
        self.keys = Keys(region)
        self.api_tokens = api_tokens
        self.profile_search = profile_search
        self.state = RegionState(store, self.keys, ProfileDocuments(profile_search))
        self.agents = AgentService(self.state, store, self.keys, bootstrap_tokens, heartbeat_interval,
                                   reboot_grace=reboot_grace)
        self.health = HealthService(self.state, store, self.keys, self.agents.last_seen, heartbeat_timeout)
        self.agents.on_seen = self.health.seen
        self.scheduler = Scheduler(self.state, store, self.keys, self.agents.report_of, self.agents.errors, limits,
                                   taskcontrol_interval, maintenance_policy=maintenance_policy)

    def metrics_text(self) -> str:
        lines = []
        now = time.time()
        stats = self.scheduler.cache.stats()
        values = {
            **{f"twine_scheduler_{k}_total": v for k, v in self.scheduler.counters.items()},
            **{f"twine_agents_{k}_total": v for k, v in self.agents.counters.items()},
            **{f"twine_health_{k}_total": v for k, v in self.health.counters.items()},
            "twine_ratelimit_held_operations_total": self.scheduler.counters["rate_limited"],
            "twine_taskcontrol_sessions": len(self.scheduler.sessions),
            "twine_taskcontrol_failing": sum(1 for s in self.scheduler.sessions.values() if s.status["ok"] is False),
            "twine_allocation_cache_hit_ratio": round(stats.hit_ratio, 4),
            "twine_allocation_cache_hits_total": stats.hits,
            "twine_allocation_cache_misses_total": stats.misses,
            "twine_machines": len(self.state.machines),
            "twine_machines_unhealthy": sum(1 for m in self.state.machines.values() if not m.healthy),
            "twine_machines_in_maintenance": sum(1 for mid in self.state.machines
                                                 if (e := self.state.maintenance_of(mid, now))
                                                 and e.phase(now) == "in progress"),
            "twine_machines_free": sum(1 for m in self.state.machines.values() if m.entitlement is None),
            "twine_jobs": len(self.state.jobs),
            "twine_etcd_revision": self.state.revision,
        }
        for k, v in values.items():
            lines.append(f"{k} {v}")
        return "\n".join(lines) + "\n"

    async def run(self, host: str, port: int, stop: asyncio.Event, notifier: Notifier | None = None) -> None:
        notifier = notifier or Notifier()
        await self.state.start()
        runner = web.AppRunner(make_app(self), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            log.info("twine-controld for region %s listening on %s:%d", self.keys.region, host, port)
            notifier.ready(f"region {self.keys.region}: {len(self.state.machines)} machines, {len(self.state.jobs)} jobs")
            async with asyncio.TaskGroup() as tg:
                loops = [tg.create_task(self.scheduler.run()), tg.create_task(self.health.run()),
                         tg.create_task(self.state.index.watching()), tg.create_task(notifier.watchdog_loop())]
                await stop.wait()
                self.agents.closing.set()
                for t in loops:
                    t.cancel()
        finally:
            await runner.cleanup()
            await self.state.stop()


def _tokens(path: str, flag: str) -> set[str]:
    try:
        tokens = {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    except OSError as e:
        raise SystemExit(_input_error(flag, f"{path}: {e.strerror}"))
    if not tokens:
        raise SystemExit(_input_error(flag, f"{path}: no token in the file"))
    return tokens


def _input_error(flag: str, why: str) -> int:
    print(f"twine-controld: {flag}: {why}", file=sys.stderr)
    return EXIT_INPUT


def _hostport(value: str, flag: str, default_port: int) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, default_port
    try:
        return host, int(port)
    except ValueError:
        raise SystemExit(_input_error(flag, f"{value!r} is not HOST:PORT"))


def etcd_endpoints(value: str) -> list[tuple[str, int]]:
    """--etcd: HOST:PORT[,HOST:PORT...] (the port defaults to 2379)."""
    out = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "2379"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"{item!r} is not HOST:PORT")
        out.append((host, int(port)))
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
    p.add_argument("--region", default="region1", help="the region this daemon serves (default %(default)s)")
    p.add_argument("--listen", default="127.0.0.1:8080", help="API address HOST:PORT (default %(default)s)")
    p.add_argument("--api-token-file", help="operator/job owner tokens, one per line (required)")
    p.add_argument("--bootstrap-token-file", help="agent bootstrap tokens, one per line (required)")
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
    store = Store(args.etcd)
    daemon = ControlDaemon(store, args.region, _tokens(args.api_token_file, "--api-token-file"),
                           _tokens(args.bootstrap_token_file, "--bootstrap-token-file"),
                           args.heartbeat_timeout, args.heartbeat_interval,
                           (*map(Path, args.profiles), *default_search_path()), limits, args.taskcontrol_interval,
                           args.maintenance_policy, args.reboot_grace)
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
        log.error("stopping: %s: %s", type(e).__name__, e)
    if failed:
        return EXIT_UNAVAILABLE
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = daemon_config.parse_args(parser(), argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
