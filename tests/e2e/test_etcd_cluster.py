"""A region that survives losing an etcd member (issue #24): a dev region whose etcd is a cluster
of 3 members (TLS to clients and peers), real twine-controld, real agents in network namespaces,
real Docker containers.

- the member that leads is SIGKILLed: writes are answered again within 5 s, every write acknowledged
  before is there after, no task restarts; the member comes back and catches up;
- the member that leads is cut off by a partition (iptables, while it runs): the same.

Run with -s to see the measured figures."""

from __future__ import annotations

import subprocess
import time

import pytest

from controlplane.devregion import AgentSpec, Region
from tests.e2e.helpers import Api, job_spec, running_region

pytestmark = pytest.mark.docker

AGENTS = [
    AgentSpec("m1", "dc1", "msb1", "rack1", cpus=2.0, memory_mb=1024),
    AgentSpec("m2", "dc2", "msb2", "rack2", cpus=2.0, memory_mb=1024),
]
BACK_WITHIN = 5.0  # seconds: writes are answered again within this after the leader member is lost


@pytest.fixture(scope="module")
def region(tmp_path_factory, docker_client):
    r = Region(tmp_path_factory.mktemp("cluster"), AGENTS, heartbeat_timeout=3.0, etcd_members=3)
    yield from running_region(r)


@pytest.fixture(scope="module")
def api(region):
    api = Api(region)
    api.ok("POST", "/v1/entitlements", {"name": "store", "machine_type": "generic", "quota": 2})
    return api


def containers(region: Region, job: str) -> dict[str, str]:
    """container id -> its start time and restart count, from Docker itself"""
    out = {}
    for c in region.containers(job):
        out[c["id"]] = subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}} {{.RestartCount}}", c["id"]],
                                      capture_output=True, text=True, check=True).stdout.strip()
    return out


def acknowledged_writes(api: Api, tag: str, n: int = 6) -> list[str]:
    """n jobs created (201: committed and seen), one task each; their handles."""
    handles = []
    for i in range(n):
        api.ok("POST", "/v1/jobs", job_spec("store", f"{tag}{i}", 1, cpus=0.05))
        handles.append(f"store/{tag}{i}")
    return handles


def first_write_after(api: Api, tag: str, since: float, timeout: float = 60) -> float:
    """Seconds from `since` to the first write answered 2xx (a job created), trying every 0.1 s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        status, last = api.call("POST", "/v1/jobs", job_spec("store", tag, 1, cpus=0.05))
        if status < 300:
            return time.monotonic() - since
        time.sleep(0.1)
    raise AssertionError(f"no write answered in {timeout} s: {last}")


def caught_up(region: Region, member: str, timeout: float = 30) -> None:
    """Until the member's revision is its cluster's (it has every write made while it was away)."""
    deadline = time.monotonic() + timeout
    others = [n for n in region.etcd_names() if n != member]
    while time.monotonic() < deadline:
        try:
            mine = region.etcd_status(member)["revision"]
            theirs = max(region.etcd_status(n)["revision"] for n in others)
            if mine >= theirs:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{member} did not catch up in {timeout} s")


def lose_the_leader(region: Region, api: Api, how: str) -> None:
    api.ok("POST", "/v1/jobs", job_spec("store", f"steady-{how}", 2, cpus=0.25))
    api.wait_running(f"store/steady-{how}")
    before = containers(region, f"store/steady-{how}")
    written = acknowledged_writes(api, f"{how}-a")
    leader = region.etcd_leader()
    since = time.monotonic()
    if how == "kill":
        region.kill(leader)
    else:
        region.partition(leader)
    seconds = first_write_after(api, f"{how}-after", since)
    print(f"\n{how} of the leader member {leader}: writes answered again after {seconds:.2f} s")
    assert seconds < BACK_WITHIN, f"writes came back after {seconds:.2f} s"
    for handle in written:  # every write acknowledged before the loss is there
        job = api.job(handle)
        assert job["state"] == "active" and len(job["tasks"]) == 1, job
    api.wait_running(f"store/steady-{how}")
    assert containers(region, f"store/steady-{how}") == before, "a task was restarted"
    if how == "kill":
        region.restart(leader)
    else:
        assert region.heal(leader) == []
    caught_up(region, leader)
    api.wait_running(f"store/{how}-after")
    assert containers(region, f"store/steady-{how}") == before, "a task was restarted"
    for handle in [*written, f"store/{how}-after", f"store/steady-{how}"]:
        api.stop(handle)


def test_the_leader_member_killed(region, api):
    lose_the_leader(region, api, "kill")


def test_the_leader_member_partitioned(region, api):
    lose_the_leader(region, api, "partition")
