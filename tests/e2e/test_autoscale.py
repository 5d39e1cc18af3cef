"""The Figure 18 loop for real (issue #26): real etcd, a real twine-controld running the SRM, four real
agents each in its own network namespace, real Docker containers whose CPU the agents measure from
their cgroups. Two entitlements: `web` (profile web: net.core.somaxconn 16384) and `batch` (profile
batch: net.ipv4.tcp_slow_start_after_idle 0), both per-namespace kernel settings each machine shows
in its namespace. Each job's tasks burn their CPU share while a load knob (a file in each of the
job's containers) says so. Night: web idles and shrinks, whole machines go back to the pool, batch
grows onto them and their kernel settings become batch's. Day: the reverse. No machine ever runs
tasks of both."""

from __future__ import annotations

import threading
import time

import pytest

from controlplane.devregion import AgentSpec, Region
from tests.conftest import TEST_IMAGE
from tests.e2e.helpers import running_region, tidy_after

pytestmark = pytest.mark.docker

# one task a machine (memory), each burning at most a fifth of a core (its cpus) while /tmp/busy exists
AGENTS = [AgentSpec(f"a{i}", f"dc{1 + i // 2}", f"msb{i}", f"rack{i}", cpus=2.0, memory_mb=1024) for i in range(4)]
BURN = ["sh", "-c", "trap 'exit 0' TERM; while :; do if [ -e /tmp/busy ]; then i=0; "
                    "while [ $i -lt 5000 ]; do i=$((i+1)); done; else sleep 0.2; fi; done"]
POLICY = {"min": 1, "max": 3, "target_cpu": 0.5, "tolerance": 0.1, "predictive": False, "scale_down_after": 8,
          "max_changes_per_hour": 60}
SOMAXCONN, SLOW_START = "/proc/sys/net/core/somaxconn", "/proc/sys/net/ipv4/tcp_slow_start_after_idle"


@pytest.fixture(scope="module")
def region(tmp_path_factory, docker_client):
    yield from running_region(Region(tmp_path_factory.mktemp("autoscale"), AGENTS, heartbeat_timeout=3.0,
                                     controld_args=("--srm-interval", "2", "--usage-sample", "1")))


@pytest.fixture(autouse=True)
def tidy(region):
    yield from tidy_after(region)


class Load(threading.Thread):
    """The load knobs: every half second, /tmp/busy is made in each running container of a job
    whose knob is on and removed where it is off (a new container gets it within half a second);
    and what runs where is looked at: a machine running tasks of two entitlements is noted."""

    def __init__(self, region: Region):
        super().__init__(daemon=True)
        self.region, self.knobs, self.stop = region, {}, threading.Event()
        self.both: list[str] = []
        self.seen: dict[str, set[str]] = {}  # machine -> entitlements whose tasks ran there

    def run(self) -> None:
        import docker

        client = docker.from_env()
        while not self.stop.is_set():
            on: dict[str, set[str]] = {}
            for c in self.region.containers():
                if c["status"] != "running" or not c["job"]:
                    continue
                on.setdefault(c["machine"], set()).add(c["job"].split("/")[0])
                knob = self.knobs.get(c["job"])
                if knob is not None:
                    try:
                        client.containers.get(c["id"]).exec_run(["touch", "/tmp/busy"] if knob else
                                                                ["rm", "-f", "/tmp/busy"])
                    except docker.errors.APIError:
                        pass  # it stopped meanwhile
            for m, ents in on.items():
                self.seen.setdefault(m, set()).update(ents)
                if len(ents) > 1:
                    self.both.append(f"{time.time():.1f} {m}: {sorted(ents)}")
            self.stop.wait(0.5)


def test_figure_18_machines_move_between_web_and_batch_with_the_load_and_are_retuned(region, api):
    api.ok("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 4, "profile": "web"})
    api.ok("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 4, "profile": "batch"})
    task = {"image": TEST_IMAGE, "command": BURN, "cpus": 0.2, "memory_mb": 600}
    for ent, name in (("web", "api"), ("batch", "work")):
        api.ok("POST", "/v1/jobs", {"entitlement": ent, "name": name, "count": 1, "task": task, "autoscale": POLICY})
    load = Load(region)
    load.knobs = {"web/api": False, "batch/work": False}
    load.start()
    names = {region.machine_id(a.name): a.name for a in AGENTS}

    def kernel(mid: str) -> tuple[str, str]:
        return tuple(region.netns_exec(names[mid], "cat", path).stdout.strip() for path in (SOMAXCONN, SLOW_START))

    def settled(web: int, batch: int, timeout: float = 180) -> dict[str, str]:
        """Wait until web runs `web` tasks and batch `batch`, each on machines its profile is applied
        on; machine -> entitlement."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = {h: api.job(h) for h in ("web/api", "batch/work")}
            running = {h: [t for t in j["tasks"] if t["state"] == "running"] for h, j in jobs.items()}
            machines = {m["id"]: m for m in api.ok("GET", "/v1/machines")["machines"]}
            where = {t["machine"]: h.split("/")[0] for h, ts in running.items() for t in ts}
            if (jobs["web/api"]["count"], jobs["batch/work"]["count"]) == (web, batch) \
                    and (len(running["web/api"]), len(running["batch/work"])) == (web, batch) \
                    and all(machines[m]["profile"]["applied"] == ent for m, ent in where.items()):
                return where
            if time.monotonic() > deadline:
                raise AssertionError(f"not settled at web {web}, batch {batch}: "
                                     f"{ {h: (j['count'], j['summary']) for h, j in jobs.items()} }\n"
                                     f"{api.ok('GET', '/v1/jobs/web/api/autoscale')['reason']}\n"
                                     f"{api.ok('GET', '/v1/jobs/batch/work/autoscale')['reason']}")
            time.sleep(1)

    try:
        settled(1, 1)
        # night: web idles, batch is busy: batch grows onto the two free machines
        load.knobs = {"web/api": False, "batch/work": True}
        night = settled(1, 3)
        for mid, ent in night.items():
            somaxconn, slow_start = kernel(mid)
            assert (somaxconn == "16384") == (ent == "web") and (slow_start == "0") == (ent == "batch"), \
                (mid, ent, somaxconn, slow_start)
        # day: web is busy, batch idles: batch shrinks, its machines go back to the pool, web takes them
        load.knobs = {"web/api": True, "batch/work": False}
        day = settled(3, 1)
        moved = [m for m, ent in day.items() if ent == "web" and night.get(m) == "batch"]
        assert len(moved) >= 2, (night, day)
        for mid, ent in day.items():
            somaxconn, slow_start = kernel(mid)
            assert (somaxconn == "16384") == (ent == "web") and (slow_start == "0") == (ent == "batch"), \
                (mid, ent, somaxconn, slow_start)
        print(f"\nnight: {night}\nday: {day}\nmoved from batch to web and re-tuned: {moved}")
        events = {h: api.ok("GET", f"/v1/jobs/{h}/autoscale")["events"] for h in ("web/api", "batch/work")}
        assert max(e["to"] for e in events["batch/work"]) == 3 and max(e["to"] for e in events["web/api"]) == 3
        # batch's scale-in from its peak to 1, each step stopping tasks: at once, or in steps while its
        # measured load falls (a fresh-clone run with the host's cores busy saw 3 -> 2 at "load 0.07
        # fit 2 for 8 s", then 2 -> 1)
        batch = events["batch/work"]
        shrinks = batch[max(i for i, e in enumerate(batch) if e["to"] == 3) + 1:]
        assert shrinks and shrinks[0]["was"] == 3 and shrinks[-1]["to"] == 1, events
        assert all(e["to"] < e["was"] and len(e["stopped"]) == e["was"] - e["to"] for e in shrinks), events
        deadline = time.monotonic() + 30  # what Docker runs, as the knobs' thread last looked
        while not all(load.seen.get(m) == {"web", "batch"} for m in moved) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert all(load.seen.get(m) == {"web", "batch"} for m in moved), load.seen
        assert not load.both, f"a machine ran tasks of web and batch at once: {load.both}"
    finally:
        load.stop.set()
        load.join(10)
