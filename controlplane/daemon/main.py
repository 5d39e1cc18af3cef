"""`twine-controld`'s command line: flags (over its config file, config.py), checked and made into
the daemon's settings and credentials, then the daemon run until SIGTERM or SIGINT.

Exit codes: 0 stopped, 2 bad input (flags, token files), 3 etcd or the listen address unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agent import tls as tls_files
from agent.errors import InputError
from agent.listener import ConnLimits
from controlplane.broker.agents import MAX_LONG_POLLS, MAX_WAIT, BootstrapFile
from controlplane.coordination.coordinator import ROLES, parse_roles, parse_shards
from controlplane.daemon import config as daemon_config
from controlplane.daemon.controld import ControlDaemon, DaemonSettings
from controlplane.daemon.intake import Intake
from controlplane.daemon.stalls import tune_collector
from controlplane.scheduler.ratelimit import Limits
from controlplane.security.sealing import Sealer
from controlplane.security.secretfile import owner_only, tokens_in
from controlplane.store import EtcdTls, Store
from controlplane.store.etcd import WRITE_TIMEOUT
from controlplane.usage.recorder import SAMPLE
from controlplane.srm.service import INTERVAL as SRM_INTERVAL
from controlplane.rebalancer.rounds import INTERVAL as REBALANCE_INTERVAL
from controlplane.rollouts.driver import INTERVAL as ROLLOUT_INTERVAL

log = logging.getLogger("twine.controld")
EXIT_OK, EXIT_INPUT, EXIT_UNAVAILABLE = 0, 2, 3


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
    p.add_argument("--etcd-write-timeout", type=float, default=WRITE_TIMEOUT,
                   help="seconds a transaction may take before it is given up and the next etcd member is used: "
                        "a write that a member proposed to a leader that died waits out etcd's own request timeout "
                        "(7 s by default) otherwise (default %(default)s)")
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
    p.add_argument("--usage-sample", type=float, default=SAMPLE,
                   help="seconds between two samples of the jobs' and entitlements' usage history, kept by the "
                        "leaders of their shards; a point a minute is their mean (default %(default)s)")
    p.add_argument("--srm-interval", type=float, default=SRM_INTERVAL,
                   help="seconds between two passes of the SRM, which sizes autoscaled jobs at the leaders of "
                        "their shards (default %(default)s)")
    p.add_argument("--rebalance-interval", type=float, default=REBALANCE_INTERVAL,
                   help="seconds between two rounds of the ReBalancer's continuous mode, at the leader of shard 0, "
                        "for the entitlements an admin enabled (twinectl rebalance enable; default %(default)s)")
    p.add_argument("--rollout-interval", type=float, default=ROLLOUT_INTERVAL,
                   help="seconds between two steps of the entitlements' host-profile rollouts at the leaders of "
                        "their shards (a step reads each rollout; writes only what moved; default %(default)s)")
    p.add_argument("--prometheus-url", default=None,
                   help="the region's Prometheus server (http://host:9090), for autoscale policies whose metric "
                        "is a query (default: none; such policies are refused)")
    p.add_argument("--header-timeout", type=float, default=ConnLimits.header_timeout,
                   help="seconds a connection has to send a request's head (and a TLS handshake), from its "
                        "opening or its last response; then it is closed (default %(default)s)")
    p.add_argument("--body-timeout", type=float, default=ConnLimits.body_timeout,
                   help="seconds a request has to send its body; then it is answered 408 (default %(default)s)")
    p.add_argument("--profiles", action="append", default=[], help="extra profile directory for validating entitlement profiles")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def settings_of(args: argparse.Namespace) -> DaemonSettings:
    """The daemon's settings from its flags (the config file's among them); exit 2 naming the
    flag that is wrong."""
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
                        ("--max-long-poll", args.max_long_poll), ("--etcd-write-timeout", args.etcd_write_timeout)):
        if not 0 < value <= 3600:
            raise SystemExit(_input_error(flag, f"{value}: seconds, more than 0 and at most 3600"))
    if not 0.05 <= args.usage_sample <= 60:
        raise SystemExit(_input_error("--usage-sample", f"{args.usage_sample}: seconds, from 0.05 to 60 (a point a "
                                      "minute is the mean of its samples)"))
    if not 1 <= args.srm_interval <= 3600:
        raise SystemExit(_input_error("--srm-interval", f"{args.srm_interval}: seconds, from 1 to 3600"))
    if not 1 <= args.rebalance_interval <= 86400:
        raise SystemExit(_input_error("--rebalance-interval", f"{args.rebalance_interval}: seconds, from 1 to 86400"))
    if not 0.1 <= args.rollout_interval <= 86400:
        raise SystemExit(_input_error("--rollout-interval", f"{args.rollout_interval}: seconds, from 0.1 to 86400"))
    if args.prometheus_url is not None and not re.match(r"^https?://[^/\s]+", args.prometheus_url):
        raise SystemExit(_input_error("--prometheus-url", f"{args.prometheus_url!r}: an http(s):// URL"))
    return DaemonSettings(
        region=args.region, heartbeat_timeout=args.heartbeat_timeout, heartbeat_interval=args.heartbeat_interval,
        profile_search=(*map(Path, args.profiles), *default_search_path()), limits=limits,
        taskcontrol_interval=args.taskcontrol_interval, maintenance_policy=args.maintenance_policy,
        reboot_grace=args.reboot_grace, roles=roles, shards=args.shards, shard_count=args.shard_count,
        lease_ttl=args.lease_ttl, advertise=args.advertise, max_txn_ops=args.max_txn_ops,
        conn_limits=ConnLimits(args.max_connections_per_client, args.max_connections, args.header_timeout,
                               args.body_timeout),
        max_long_polls=args.max_long_polls, max_long_poll=args.max_long_poll, usage_sample=args.usage_sample,
        srm_interval=args.srm_interval, prometheus_url=args.prometheus_url,
        rebalance_interval=args.rebalance_interval, rollout_interval=args.rollout_interval)


@dataclass
class Credentials:
    api_tokens: set[str]
    bootstrap: BootstrapFile
    sealer: Sealer
    tls: ssl.SSLContext | None  # the API's, served over TLS when set
    client_tls: ssl.SSLContext | None  # how the other replicas are verified (None: the system's CAs)
    etcd_tls: EtcdTls | None


def credentials_of(args: argparse.Namespace) -> Credentials:
    """Tokens, keys and certificates from the files the flags name, each refused (exit 2, naming
    the flag) when others may read it or it does not hold what it should."""
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
    return Credentials(api_tokens, boot, sealer, tls, client_tls, etcd_tls)


async def _main(args: argparse.Namespace, intake: Intake | None = None) -> int:
    lhost, lport = _hostport(args.listen, "--listen", 8080)
    settings = settings_of(args)
    c = credentials_of(args)
    store = Store(args.etcd, tls=c.etcd_tls, write_timeout=args.etcd_write_timeout)
    daemon = ControlDaemon(store, settings, c.api_tokens, c.bootstrap, c.tls, c.client_tls, c.sealer, intake)
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
        intake = Intake()  # the loop's polls say how far its intake has been heard (health/check.py)
        with asyncio.Runner(loop_factory=intake.loop) as runner:
            return runner.run(_main(args, intake))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
