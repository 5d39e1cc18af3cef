"""The agent's local HTTP endpoint: /healthz, /status (JSON), /metrics (Prometheus text).

Bound to loopback or a unix socket: it is for the host's operator and monitoring, not the network.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from agent.listener import ConnLimits, Listener

if TYPE_CHECKING:
    from agent.daemon import Agent

AGENT = web.AppKey("agent", object)
_dumps = partial(json.dumps, default=str)


def status(agent: "Agent") -> dict:
    record = agent.engine.current()
    by_task = {str(c.task): c for c in agent.containers}
    waiting = {str(k): why for k, why in agent.last_plan.waiting}
    tasks = []
    for spec in agent.desired.tasks:
        key = str(spec.key)
        c = by_task.get(key)
        if c is not None and c.running and c.spec_hash == spec.spec_hash():
            state = "running"
        elif key in agent.task_errors:
            state = "failed"
        elif c is not None and not c.running:
            state = "exited"
        else:
            state = "pending"
        tasks.append({
            "job": spec.job, "index": spec.index, "spec_version": spec.spec_version, "image": spec.image,
            "state": state, "container": c.to_json() if c else None,
            "restarts": (c.generation - 1) if c else 0, "waiting": waiting.get(key, ""),
            "error": agent.task_errors.get(key, ""), "last_exit": agent.last_exit.get(key),
        })
    return {
        "machine": {
            "id": agent.config.machine_id, "hostname": agent.config.hostname,
            **{k: getattr(agent.config.labels, k) for k in ("region", "dc", "msb", "rack", "machine_type")},
        },
        "desired": {"version": agent.desired.version, "source": agent.desired.source, "error": agent.source_error},
        "profile": {
            "desired": agent.desired.profile,
            "applied": record["profile"] if record else None,
            "ready": agent.profile_ready(),
            "switch_seconds": record["switch_seconds"] if record else None,
            "not_applicable": record["not_applicable"] if record else {},
            "last_report": agent.profile_report.to_json() if agent.profile_report else None,
        },
        "tasks": tasks,
        # Containers of this machine that no desired task wants: being stopped and removed.
        "stopping": [c.id for c in agent.containers if c.task not in {t.key for t in agent.desired.tasks}],
        "adopted": agent.adopted,
        "health": agent.health.to_json() if agent.health else None,
        "counters": agent.counters,
        "uptime_seconds": round(time.time() - agent.started_at, 3),
        # Only when the desired state comes from twine-controld: {url, urls, heartbeat_to, registered,
        # last_heartbeat_ok, error}; url is the replica calls go to now, heartbeat_to the one heartbeats go to
        # when it is another.
        **({"control_plane": agent.client.status()} if agent.client is not None else {}),
    }


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(agent: "Agent") -> str:
    s = status(agent)
    lines = ["# TYPE twine_agent_up gauge", "twine_agent_up 1"]
    lines.append("# TYPE twine_agent_tasks gauge")
    for state in ("running", "pending", "exited", "failed"):
        lines.append(f'twine_agent_tasks{{state="{state}"}} {sum(t["state"] == state for t in s["tasks"])}')
    lines.append("# TYPE twine_agent_task_restarts gauge")
    for t in s["tasks"]:
        lines.append(f'twine_agent_task_restarts{{job="{_esc(t["job"])}",index="{t["index"]}"}} {t["restarts"]}')
    prof = s["profile"]
    lines.append("# TYPE twine_agent_profile_ready gauge")
    lines.append(f'twine_agent_profile_ready{{profile="{_esc(prof["desired"] or "")}"}} {int(prof["ready"])}')
    if prof["switch_seconds"] is not None:
        lines.append("# TYPE twine_agent_profile_switch_seconds gauge")
        lines.append(f'twine_agent_profile_switch_seconds{{profile="{_esc(prof["applied"])}"}} {prof["switch_seconds"]:.6f}')
    for name, value in s["counters"].items():
        lines.append(f"# TYPE twine_agent_{name}_total counter")
        lines.append(f"twine_agent_{name}_total {value}")
    h = s["health"]
    if h:
        lines += [
            "# TYPE twine_agent_healthy gauge", f"twine_agent_healthy {int(h['ok'])}",
            "# TYPE twine_agent_docker_up gauge", f"twine_agent_docker_up {int(h['docker'])}",
            "# TYPE twine_agent_cpu_percent gauge", f"twine_agent_cpu_percent {h['cpu_percent']}",
            "# TYPE twine_agent_memory_used_ratio gauge", f"twine_agent_memory_used_ratio {h['memory_used']}",
            "# TYPE twine_agent_disk_used_ratio gauge", f"twine_agent_disk_used_ratio {h['disk_used']}",
            "# TYPE twine_agent_load1 gauge", f"twine_agent_load1 {h['load'][0]}",
            "# TYPE twine_agent_profile_drift_settings gauge", f"twine_agent_profile_drift_settings {len(h['profile_drift'])}",
        ]
    return "\n".join(lines) + "\n"


async def _healthz(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    h = agent.health
    ok = h is None or h.ok
    return web.Response(status=200 if ok else 503, text="ok\n" if ok else "unhealthy: " + "; ".join(h.problems) + "\n")


async def _status(request: web.Request) -> web.Response:
    return web.json_response(status(request.app[AGENT]), dumps=_dumps)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text=metrics(request.app[AGENT]), content_type="text/plain", charset="utf-8")


def make_app(agent: "Agent") -> web.Application:
    app = web.Application()
    app[AGENT] = agent
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    return app


class Served:
    """The status server: cleanup() stops it."""

    def __init__(self, runner: web.AppRunner, listener: Listener | None):
        self.runner, self.listener = runner, listener

    async def cleanup(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        await self.runner.cleanup()


async def serve(agent: "Agent") -> Served:
    """On a unix socket (only local users reach it), or on TCP within the connection limits that
    guard the control daemon's API (agent/listener.py)."""
    limits = ConnLimits(per_client=32, total=256)
    runner = web.AppRunner(make_app(agent), access_log=None, **limits.runner_kwargs())
    await runner.setup()
    listen = agent.config.listen
    if listen.startswith("unix:"):
        await web.UnixSite(runner, listen[len("unix:"):]).start()
        return Served(runner, None)
    host, _, port = listen.rpartition(":")
    return Served(runner, await Listener(runner, limits).start(host or "127.0.0.1", int(port)))
