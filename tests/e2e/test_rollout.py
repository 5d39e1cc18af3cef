"""Host-profile rollouts end to end (issue #28): real etcd, a real twine-controld, three real agents
in network namespaces (three MSBs), real Docker containers, and the SDK's replica-aware
TaskController (one shard, three replicas: never two down).

A profile change reaches the entitlement's three machines one at a time: each machine's task is
stopped (a `reprofile` operation the controller acked) before its agent switches the profile and
started after; each namespace's kernel holds the new value afterwards (net.core.somaxconn is per
network namespace: each agent's own). A profile that the first machine's kernel refuses (a value
out of its range) fails the first batch: that machine is rolled back, the others never change."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from controlplane.devregion import AgentSpec, Region
from controlplane.taskcontrol.controllers.replica_aware import ReplicaAware
from controlplane.taskcontrol.sdk import Background
from tests.e2e.helpers import job_spec, running_indices, running_region, tidy_after

pytestmark = pytest.mark.docker

AGENTS = [AgentSpec(f"p{i}", "dc1", f"msb{i}", f"rack{i}", cpus=1.0, memory_mb=512) for i in range(1, 4)]
SOMAXCONN, FIN_TIMEOUT = "/proc/sys/net/core/somaxconn", "/proc/sys/net/ipv4/tcp_fin_timeout"
PROFILES = {
    "roll-a": '[sysctl]\n"net.core.somaxconn" = 1111\n',
    "roll-b": '[sysctl]\n"net.core.somaxconn" = 2222\n',
    # the kernel refuses somaxconn -1 (EINVAL): the agent's apply fails and is undone there
    "roll-bad": '[sysctl]\n"net.ipv4.tcp_fin_timeout" = 33\n"net.core.somaxconn" = -1\n',
}


@pytest.fixture(scope="module")
def region(tmp_path_factory, docker_client):
    workdir = tmp_path_factory.mktemp("rollout")
    profiles = workdir / "profiles"
    profiles.mkdir()
    for name, text in PROFILES.items():
        (profiles / f"{name}.toml").write_text(text)
    yield from running_region(Region(workdir, AGENTS, heartbeat_timeout=3.0,
                                     controld_args=("--profiles", str(profiles), "--taskcontrol-interval", "0.5")))


@pytest.fixture(autouse=True)
def tidy(region):
    yield from tidy_after(region)


def somaxconn(region: Region, path: str = SOMAXCONN) -> dict[str, str]:
    return {a.name: region.netns_exec(a.name, "cat", path).stdout.strip() for a in AGENTS}


class Watch(threading.Thread):
    """Every 50 ms: the machines whose task Docker does not run, and the rollout's machines in a batch."""

    def __init__(self, region: Region, api, handle: str, ent: str):
        super().__init__(daemon=True)
        self.region, self.api, self.handle, self.ent = region, api, handle, ent
        self.most_down = 0  # tasks of the job not running in Docker at once
        self.most_switching = 0  # machines in a batch at once
        self.stopped_on: set[str] = set()  # machines whose task Docker was seen not running
        self.halt = threading.Event()

    def run(self) -> None:
        ids = {self.region.machine_id(a.name): a.name for a in AGENTS}
        while not self.halt.is_set():
            running = running_indices(self.region, self.handle)
            self.most_down = max(self.most_down, 3 - len(running))
            status, r = self.api.call("GET", f"/v1/entitlements/{self.ent}/rollout")
            if status == 200:
                busy = [m["id"] for m in r["machines"] if m["phase"] in ("draining", "switching", "starting")]
                self.most_switching = max(self.most_switching, len(busy))
                on = {ids.get(m) for ms in running.values() for m in ms}
                self.stopped_on |= {ids[m] for m in busy if ids.get(m) not in on}
            time.sleep(0.05)


def test_a_profile_change_switches_one_machine_at_a_time_with_its_task_stopped_around_it(region, api):
    with Background(ReplicaAware({"s": [0, 1, 2]})) as url:
        api.ok("POST", "/v1/entitlements", {"name": "tuned", "machine_type": "generic", "quota": 3, "profile": "roll-a",
                                            "allow_controller_networks": ["127.0.0.0/8"], "rollout": {"deadline": 60}})
        api.ok("POST", "/v1/jobs", job_spec("tuned", "svc", 3, controller=url))
        api.wait_running("tuned/svc", timeout=90)
        assert somaxconn(region) == {a.name: "1111" for a in AGENTS}
        # what an update would do, asked of the controller in dry-run calls: one replica at a time
        spec = Path(region.workdir) / "svc.yaml"
        spec.write_text(json.dumps(job_spec("tuned", "svc", 3, controller=url, task={"env": {"RELEASE": "2"}})))
        dry = region.twinectl("job", "update", str(spec), "--dry-run", timeout=60)
        print(f"$ twinectl job update {spec.name} --dry-run\n{dry.stdout}")
        assert dry.returncode == 0 and "3 task(s) in 3 round(s)" in dry.stdout, dry.stdout + dry.stderr
        assert api.job("tuned/svc")["spec_version"] == 1
        watch = Watch(region, api, "tuned/svc", "tuned")
        watch.start()
        try:
            done = region.twinectl("entitlement", "modify", "tuned", "--profile", "roll-b", "--wait", "240", timeout=300)
        finally:
            watch.halt.set()
            watch.join(5)
        print(f"$ twinectl entitlement modify tuned --profile roll-b --wait 240\n{done.stdout}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "done: 3 done" in done.stdout, done.stdout
        r = api.ok("GET", "/v1/entitlements/tuned/rollout")
        assert r["state"] == "done" and [len(b["machines"]) for b in r["batches"]] == [1, 1, 1], r
        assert somaxconn(region) == {a.name: "2222" for a in AGENTS}, "each namespace holds the new value"
        assert watch.most_switching == 1, "never two machines at once"
        assert watch.most_down <= 1, "the replica-aware controller never had two replicas down"
        assert watch.stopped_on == {a.name for a in AGENTS}, "each machine's task was stopped around its switch"
        job = api.wait_running("tuned/svc")
        assert len({t["machine"] for t in job["tasks"]}) == 3
        reprofiles = [e["reason"] for e in api.ok("GET", "/v1/events")["events"] if e["kind"] == "rollout"]
        assert sum(" done: " in e and e.startswith("batch ") for e in reprofiles) == 3, reprofiles
        api.stop("tuned/svc")


def test_a_profile_the_first_machine_refuses_is_rolled_back_there_and_the_others_never_change(region, api):
    api.ok("POST", "/v1/entitlements", {"name": "risky", "machine_type": "generic", "quota": 3, "profile": "roll-a",
                                        "rollout": {"deadline": 60}})
    api.ok("POST", "/v1/jobs", job_spec("risky", "svc", 3))
    api.wait_running("risky/svc", timeout=90)
    assert somaxconn(region) == {a.name: "1111" for a in AGENTS}
    fin = somaxconn(region, FIN_TIMEOUT)
    seen: dict[str, set[tuple[str, str]]] = {a.name: set() for a in AGENTS}
    halt = threading.Event()

    def sample() -> None:  # what each namespace's kernel holds while the rollout goes on
        while not halt.is_set():
            fins = somaxconn(region, FIN_TIMEOUT)
            for name, v in somaxconn(region).items():
                seen[name].add((v, fins[name]))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        done = region.twinectl("entitlement", "modify", "risky", "--profile", "roll-bad", "--wait", "240", timeout=300)
    finally:
        halt.set()
        sampler.join(5)
    assert done.returncode == 1, done.stdout + done.stderr
    r = api.ok("GET", "/v1/entitlements/risky/rollout")
    assert r["state"] == "rolled_back", r
    first = r["batches"][0]
    assert first["outcome"] == "failed" and "could not apply roll-bad" in first["why"], first
    assert "somaxconn" in first["why"], first
    assert api.ok("GET", "/v1/entitlements/risky")["profile"] == "roll-a"
    ids = {region.machine_id(a.name): a.name for a in AGENTS}
    changed = ids[first["machines"][0]]
    assert [b["machines"] for b in r["batches"]] == [first["machines"], first["machines"]]
    assert all(seen[a.name] == {("1111", fin[a.name])} for a in AGENTS if a.name != changed), seen
    assert somaxconn(region) == {a.name: "1111" for a in AGENTS} and somaxconn(region, FIN_TIMEOUT) == fin
    assert all(api.machine_of(m)["profile"]["applied"] == "roll-a" for m in ids)
    api.wait_running("risky/svc")
    api.stop("risky/svc")
