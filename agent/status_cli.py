"""`twine-agent status`: a running agent's /status as a readable summary (or --json)."""

from __future__ import annotations

import json
import sys
import urllib.request

from agent.console import EXIT_OK, EXIT_UNAVAILABLE, dump
from agent.config import AgentConfig


def fetch_status(listen: str, timeout: float = 5.0) -> dict:
    if listen.startswith("unix:"):
        import http.client
        import socket

        class _Conn(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(listen[len("unix:"):])

        conn = _Conn("localhost")
        conn.request("GET", "/status")
        return json.loads(conn.getresponse().read())
    with urllib.request.urlopen(f"http://{listen}/status", timeout=timeout) as r:
        return json.loads(r.read())


def status_command(args, config: AgentConfig) -> int:
    listen = args.listen or config.listen
    try:
        s = fetch_status(listen)
    except OSError as e:
        print(f"twine-agent: no agent answers on {listen}: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        dump(s)
        return EXIT_OK
    m, p, h = s["machine"], s["profile"], s["health"]
    print(f"machine {m['id']} ({m['hostname']}) region={m['region']} dc={m['dc']} msb={m['msb']} rack={m['rack']} type={m['machine_type']}")
    switch = f", switched in {p['switch_seconds'] * 1000:.1f} ms" if p["switch_seconds"] is not None else ""
    print(f"profile: desired={p['desired']} applied={p['applied']} ready={p['ready']}{switch}")
    for sid, why in p["not_applicable"].items():
        print(f"  not applicable: {sid}: {why}")
    if p["last_report"] and not p["last_report"]["ok"]:
        print(f"  last switch failed: {p['last_report']['error']}")
    cp = s.get("control_plane")
    if cp:
        others = [u for u in cp["urls"] if u != cp["url"]]
        print(f"control plane: {cp['url']}" + (f" (then {', '.join(others)})" if others else "")
              + (f"; heartbeats to {cp['heartbeat_to']}" if cp["heartbeat_to"] else "")
              + f"; {'registered' if cp['registered'] else 'not registered'}"
              + (f"; {cp['error']}" if cp["error"] else ""))
    if s["desired"]["error"]:
        print(f"desired state rejected: {s['desired']['error']}")
    if h:
        print(f"health: {'ok' if h['ok'] else 'UNHEALTHY: ' + '; '.join(h['problems'])} "
              f"(cpu {h['cpu_percent']:.0f}%, mem {h['memory_used']:.0%}, disk {h['disk_used']:.0%}, load {h['load'][0]:.2f}, docker {'up' if h['docker'] else 'down'})")
    print(f"{'TASK':<28} {'STATE':<8} {'VER':>3} {'RESTARTS':>8}  CONTAINER     NOTE")
    for t in s["tasks"]:
        cid = (t["container"] or {}).get("id", "")[:12]
        note = t["error"] or t["waiting"] or ""
        print(f"{t['job'] + '#' + str(t['index']):<28} {t['state']:<8} {t['spec_version']:>3} {t['restarts']:>8}  {cid:<12}  {note}")
    return EXIT_OK
