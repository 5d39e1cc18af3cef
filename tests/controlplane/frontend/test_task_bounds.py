"""A task's bounds are one set: what the API's schema (controlplane/frontend/schema.py) takes, the agent's
task parser (agent/models.py, which also checks the records the daemon stores) takes, at every edge."""

from __future__ import annotations

import pytest

from agent.errors import DesiredStateError
from agent.models import TaskSpec
from controlplane.frontend.schema import TaskTemplate, checked
from controlplane.store.records import ApiError

EDGES = {
    "image": ["busybox", "twine/busybox:1", "reg.example:5000/a/b@sha256:" + "a" * 64, "a" * 512, "a" * 513, "",
              " busybox", "busy box", "-bad", ".bad", "bad\tname", "bäd", "a;rm", "busybox\n"],
    "cpus": [0, 0.001, 1, 1024, 1024.5, -1],
    "memory_mb": [3, 4, 128, 4_194_304, 4_194_305],
    "pids": [0, 1, 4_194_304, 4_194_305],
    "network_mode": ["bridge", "none", "host", "HOST", ""],
    "env": [{"A": "1"}, {"_a9": "x"}, {"A" * 256: "1"}, {"A" * 257: "1"}, {"A\n": "1"}, {"1A": "1"}, {"A-B": "1"}],
}


def _api(task: dict) -> bool:
    """As the API checks a body (schema.checked, strict)."""
    try:
        checked(task, TaskTemplate)
        return True
    except ApiError:
        return False


def _agent(task: dict) -> bool:
    try:
        TaskSpec.from_json({"job": "web/api", "index": 0, **task}, "test", "task")
        return True
    except DesiredStateError:
        return False


@pytest.mark.parametrize("field", sorted(EDGES))
def test_the_api_and_the_agent_take_the_same_tasks_at_every_edge(field):
    disagree = []
    for value in EDGES[field]:
        task = {"image": "busybox", field: value}
        if _api(task) != _agent(task):
            disagree.append((value if not isinstance(value, str) or len(value) < 40 else value[:20] + "...",
                             "api" if _api(task) else "agent"))
    assert disagree == [], f"taken by one only: {disagree}"
    assert any(_api({"image": "busybox", field: v}) for v in EDGES[field])
    assert not all(_api({"image": "busybox", field: v}) for v in EDGES[field])
