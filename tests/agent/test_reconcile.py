"""The pure reconciler, table-driven with small builders."""

from __future__ import annotations

import pytest

from agent.models import TaskSpec
from agent.reconcile import parse_time, plan, restart_backoff
from agent.runtime.base import ContainerInfo, task_labels

NOW = 1_700_000_000.0


def task(index=0, version=1, job="e/j", image="img:1") -> TaskSpec:
    return TaskSpec(job=job, index=index, spec_version=version, image=image)


def container(spec: TaskSpec, status="running", generation=1, exit_code=None, finished="0001-01-01T00:00:00Z", cid=None):
    return ContainerInfo(
        id=cid or f"c{spec.index}g{generation}", name="n", labels=task_labels("m", spec, generation),
        status=status, exit_code=exit_code, started_at="", finished_at=finished,
    )


def iso(ts: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def test_places_missing_tasks_only_once_profile_is_ready():
    t0, t1 = task(0), task(1)
    assert plan((t0, t1), [], profile_ready=True, now=NOW).place == ((t0, 1), (t1, 1))
    waiting = plan((t0, t1), [], profile_ready=False, now=NOW)
    assert waiting.place == () and [w[1] for w in waiting.waiting] == ["host profile not applied yet"] * 2


def test_running_containers_of_the_same_spec_are_adopted_not_restarted():
    t0 = task(0)
    c = container(t0)
    p = plan((t0,), [c], profile_ready=True, now=NOW)
    assert p.keep == (c,) and p.empty()


def test_running_tasks_keep_running_while_a_profile_is_pending():
    t0 = task(0)
    c = container(t0)
    p = plan((t0,), [c], profile_ready=False, now=NOW)
    assert p.keep == (c,) and p.empty()


def test_changed_spec_is_updated_and_undesired_containers_stopped():
    old, new, gone = task(0, version=1), task(0, version=2), task(5)
    c_old, c_gone = container(old), container(gone)
    p = plan((new,), [c_old, c_gone], profile_ready=True, now=NOW)
    assert p.update == ((c_old, new, 1),) and p.stop == (c_gone,)


def test_exited_task_restarts_after_backoff_with_the_next_generation():
    t0 = task(0)
    exited = container(t0, status="exited", generation=3, exit_code=1, finished=iso(NOW - 1))
    p = plan((t0,), [exited], profile_ready=True, now=NOW)
    assert p.restart == () and "restarting in 3.0s" in p.waiting[0][1]
    assert p.due_at == pytest.approx(NOW + 3.0)  # the agent's next pass comes then, not at its interval
    p = plan((t0,), [exited], profile_ready=True, now=NOW + 3.5)
    assert p.restart == ((exited, t0, 4),) and p.due_at is None


def test_only_one_container_per_task_survives():
    t0 = task(0)
    old = container(t0, status="exited", generation=1, exit_code=0, finished=iso(NOW - 100), cid="old")
    new = container(t0, generation=2, cid="new")
    p = plan((t0,), [new, old], profile_ready=True, now=NOW)
    assert p.keep == (new,) and p.stop == (old,)


def test_backoff_and_docker_time_parsing():
    assert [restart_backoff(g) for g in (1, 2, 3, 6, 10)] == [1, 2, 4, 30, 30]
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert abs(parse_time("2024-01-02T03:04:05.123456789Z") - 1704164645.123456789) < 1e-6
