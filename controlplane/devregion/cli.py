"""`python -m controlplane.devregion up|status|kill|restart|partition|heal|down`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from controlplane.devregion.layout import STATE_FILE
from controlplane.devregion.region import Region
from controlplane.devregion.spec import AgentSpec, default_agents


def _load_agents(arg: str, kernel_owner: str | None) -> list[AgentSpec]:
    if arg == "default":
        return default_agents(kernel_owner)
    specs = [AgentSpec(**a) for a in json.loads(Path(arg).read_text())]
    if kernel_owner is not None:
        from dataclasses import replace

        if kernel_owner not in {a.name for a in specs}:
            raise ValueError(f"--kernel-owner {kernel_owner}: no such agent")
        specs = [replace(a, owns_kernel=a.name == kernel_owner) for a in specs]
    return specs


def _cmd_up(args) -> int:
    agents = _load_agents(args.agents, args.kernel_owner)
    region = Region(args.dir, agents, region=args.region, heartbeat_timeout=args.heartbeat_timeout,
                    start_timeout=args.timeout, etcd_members=args.etcd_members,
                    controld_args=tuple(args.controld_arg))

    def on_term(signum, frame):  # tear down what was started, as on Ctrl-C
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        region.start()
    except Exception as e:  # noqa: BLE001
        print(f"devregion: up failed: {e}", file=sys.stderr)
        print(f"devregion: everything started was stopped again; logs in {region.log_dir}", file=sys.stderr)
        return 1
    py = sys.executable
    print(f"region {region.region} is up (prefix {region.prefix}, network {region.network.subnet}, bridge {region.network.bridge})")
    print(f"  controld   {region.url}   (log {region.log_path('controld')})")
    members = "" if region.etcd_members == 1 else f"   ({', '.join(region.etcd_names())}: members of one cluster)"
    print(f"  etcd       {','.join(region.etcd_endpoints())}{members}")
    for name, s in region.specs.items():
        kernel = ", owns the kernel" if s.owns_kernel else ""
        print(f"  agent {name:<4} machine {region.machine_id(name)}  {region.agent_ip(name)}  {s.dc}/{s.msb}/{s.rack}{kernel}")
    print(f"  api token  {region.api_token_file}   (admin; scoped ones: twinectl token create --role owner|reader)")
    print(f"  CA         {region.ca_file}   (controld serves https; etcd wants client certificates)")
    print("twinectl:")
    print(f"  {py} -m controlplane.cli.twinectl --url {region.url} --ca {region.ca_file} "
          f"--token-file {region.api_token_file} machine list")
    print(f"  (or: export TWINE_URL={region.url} TWINE_CA={region.ca_file} TWINE_TOKEN_FILE={region.api_token_file}; "
          ".venv/bin/twinectl machine list)")
    names = "etcd, controld, an agent" if region.etcd_members == 1 else \
        f"etcd (all members), {', '.join(region.etcd_names())}, etcd-leader, controld, an agent"
    print(f"status / rehearse a failure (NAME: {names}) / stop:")
    print(f"  {py} -m controlplane.devregion status --dir {region.workdir}")
    print(f"  {py} -m controlplane.devregion kill|restart|partition|heal NAME --dir {region.workdir}")
    print(f"  {py} -m controlplane.devregion down --dir {region.workdir}")
    return 0


def _cmd_down(args) -> int:
    if not (Path(args.dir) / STATE_FILE).exists():
        print(f"devregion: no {STATE_FILE} in {args.dir}: nothing to stop")
        return 0
    region = Region.from_dir(args.dir)
    problems = region.stop()
    for p in problems:
        print(f"devregion: {p}", file=sys.stderr)
    print(f"region in {region.workdir} stopped{' with problems' if problems else ''} (logs kept in {region.log_dir})")
    return 1 if problems else 0


def _recorded(args) -> Region | None:
    """The region recorded in --dir, or None (said on stderr) when there is none."""
    if not (Path(args.dir) / STATE_FILE).exists():
        print(f"devregion: no {STATE_FILE} in {args.dir}", file=sys.stderr)
        return None
    return Region.from_dir(args.dir)


def _cmd_status(args) -> int:
    if (region := _recorded(args)) is None:
        return 3
    procs = {k: (ref.pid if ref and ref.alive() else None) for k, ref in region.procs.items()}
    agents = {}
    for name in region.specs:
        if region.stopped:
            agents[name] = {"answers": False, "error": "region stopped"}
            continue
        try:
            s = region.agent_status(name, timeout=2)
            agents[name] = {"answers": True, "tasks": len(s.get("tasks", [])), "profile": (s.get("profile") or {}).get("applied")}
        except Exception as e:  # noqa: BLE001
            agents[name] = {"answers": False, "error": str(e)}
    data = region.to_dict()
    if args.json:
        json.dump({"region": data, "alive": procs, "agents": agents}, sys.stdout, indent=2)
        print()
    else:
        print(f"region {region.region} in {region.workdir}: {'stopped' if region.stopped else 'started'}, url {data['url']}")
        for key, pid in procs.items():
            print(f"  {key:<16} {'running, pid ' + str(pid) if pid else 'not running'}")
        for name, a in agents.items():
            print(f"  agent {name}: " + (f"answers, {a['tasks']} task(s), profile {a['profile']}" if a["answers"] else f"no answer ({a['error']})"))
        if region.partitioned:
            print(f"  partitioned: {', '.join(sorted(region.partitioned))} (heal: ... devregion heal NAME --dir {region.workdir})")
    ok = not region.stopped and all(procs.values()) and all(a["answers"] for a in agents.values())
    return 0 if ok else 3


def _cmd_rehearse(args) -> int:
    """kill, restart, partition, heal: one process of a running region."""
    if (region := _recorded(args)) is None:
        return 3
    if region.stopped:
        print(f"devregion: the region in {region.workdir} is stopped", file=sys.stderr)
        return 3
    name = args.name
    try:
        if name == "msb" and args.command in ("kill", "heal"):  # a whole MSB: every agent of it
            if not args.value:
                raise KeyError(f"{args.command} msb needs the MSB's name: {args.command} msb NAME")
            names = region.kill_msb(args.value) if args.command == "kill" else region.heal_msb(args.value)
            print(f"msb {args.value}: {', '.join(names)} {'stopped' if args.command == 'kill' else 'running again'}")
            return 0
        if args.value:
            raise KeyError(f"one NAME only (two: {args.command} msb NAME)")
        if args.command == "kill":
            code = region.kill(name, getattr(signal, f"SIG{args.signal.upper().removeprefix('SIG')}"))
            print(f"{region.resolve(name) if name != 'etcd-leader' else 'the etcd leader'} stopped"
                  f"{f' (exit {code})' if code is not None else ''}")
        elif args.command == "restart":
            name = region.resolve(name)
            region.restart(name)
            pids = [region.procs[k].pid for k in (region.etcd_names() if name == "etcd" else [region._key(name)])]
            print(f"{name} running again, pid {', '.join(map(str, pids))}")
        elif args.command == "partition":
            name = region.resolve(name)
            region.partition(name)
            print(f"{name} cut off (heal: python -m controlplane.devregion heal {name} --dir {region.workdir})")
        else:
            problems = region.heal(name)
            for p in problems:
                print(f"devregion: {p}", file=sys.stderr)
            print(f"{name or 'every partition'} healed{' with problems' if problems else ''}")
            return 1 if problems else 0
    except (KeyError, RuntimeError, AttributeError) as e:
        print(f"devregion: {args.command} {name}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    import controlplane.devregion as package  # its docstring is the usage

    p = argparse.ArgumentParser(prog="python -m controlplane.devregion", description=package.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a region (returns once everything answers; processes keep running)")
    up.add_argument("--dir", required=True, help="working directory: region.json, tokens, logs/, agent state")
    up.add_argument("--agents", default="default",
                    help="'default' (m1 dc1/msb1/rack1, m2 dc1/msb2/rack2, m3 dc2/msb3/rack3) or a JSON file of AgentSpec objects")
    up.add_argument("--kernel-owner", metavar="NAME", help="the agent that owns kernel-wide settings (default: none)")
    up.add_argument("--region", default="local")
    up.add_argument("--heartbeat-timeout", type=float, default=3.0)
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each process to answer")
    up.add_argument("--controld-arg", action="append", default=[], metavar="ARG",
                    help="a twine-controld flag, given once per word (--controld-arg=--srm-interval --controld-arg=5)")
    up.add_argument("--etcd-members", type=int, choices=(1, 3, 5), default=1,
                    help="etcd as one member (default) or a cluster of 3 or 5, each on a loopback address of its own "
                         "(127.0.0.11, ...), with TLS to its peers")
    down = sub.add_parser("down", help="stop everything recorded in DIR/region.json")
    down.add_argument("--dir", required=True)
    st = sub.add_parser("status", help="what is running")
    st.add_argument("--dir", required=True)
    st.add_argument("--json", action="store_true")
    what = "etcd (every member), etcd-N (one member of a cluster), etcd-leader (the member that leads now), " \
           "controld, or an agent's name"
    k = sub.add_parser("kill", help="signal one process (SIGKILL by default) and wait for it to exit; its data stays")
    k.add_argument("name", metavar="NAME", help=what + "; or msb NAME: every agent of that MSB at once")
    k.add_argument("value", nargs="?", metavar="MSB", help=argparse.SUPPRESS)
    k.add_argument("--signal", default="KILL", help="KILL (default), TERM, INT, ...")
    r = sub.add_parser("restart", help="stop one process (SIGTERM) if it runs and start it again on the same data")
    r.add_argument("name", metavar="NAME", help=what)
    pa = sub.add_parser("partition", help="cut one process off while it runs (its connections go silent)")
    pa.add_argument("name", metavar="NAME", help=what)
    h = sub.add_parser("heal", help="end a partition (no NAME: every one); msb NAME: start that MSB's agents again")
    h.add_argument("name", metavar="NAME", nargs="?", help=what)
    h.add_argument("value", nargs="?", metavar="MSB", help=argparse.SUPPRESS)
    for cmd in (k, r, pa, h):
        cmd.add_argument("--dir", required=True)
    for cmd in (r, pa):
        cmd.set_defaults(value=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="devregion: %(message)s")
    if os.geteuid() != 0:
        print("devregion: run as root (network namespaces, bridge, veths)", file=sys.stderr)
        return 1
    return {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status, "kill": _cmd_rehearse, "restart": _cmd_rehearse,
            "partition": _cmd_rehearse, "heal": _cmd_rehearse}[args.command](args)
