"""What a running agent says of itself: `GET /status` (http.py), `twine-agent status`
(status_cli.py), and the numbers of `GET /metrics` (metrics.py) are made from it."""

from __future__ import annotations

import time
from typing import Any

from agent.report import steady


def status(agent: Any) -> dict:
    """`agent`: the running Agent (daemon.py)."""
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
            "steady": c is not None and steady(c, agent.listed_at),  # agent/report.py
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
        "usage": agent.sampler.usage,  # as the last heartbeat carried it (agent/usage.py); None before a window
        "counters": agent.counters,
        "uptime_seconds": round(time.time() - agent.started_at, 3),
        # Only when the desired state comes from twine-controld: {url, urls, heartbeat_to, registered,
        # last_heartbeat_ok, error}; url is the replica calls go to now, heartbeat_to the one heartbeats go to
        # when it is another.
        **({"control_plane": agent.client.status()} if agent.client is not None else {}),
    }
