"""Opportunistic capacity for real (issue #37): real etcd, a real twine-controld running the SRM,
four real agents each in its own network namespace, real Docker containers. `web` is guaranteed
(profile web: net.core.somaxconn 16384) and autoscaled; `batch` is opportunistic (profile batch:
net.ipv4.tcp_slow_start_after_idle 0, notice 60 s) with a TaskController written with the SDK that
acks the reclaims it is told of. Batch fills the machines web does not use; web's load rises: the
SRM grows it, its new tasks find no machine, and batch's machines are taken back: its controller
gets the notices and acks, batch's tasks stop long before the deadline, web's start on those
machines under web's profile, and no machine ever runs both. Then web's MSB is lost (every agent
of it killed): web's task runs again elsewhere, on the machine batch is evicted from without notice."""

from __future__ import annotations

import time

import pytest

from controlplane.devregion import AgentSpec, Region
from controlplane.taskcontrol.sdk import Background, TaskController
from tests.conftest import TEST_IMAGE
from tests.e2e.helpers import running_region, tidy_after
from tests.e2e.test_autoscale import BURN, SLOW_START, SOMAXCONN, Load

pytestmark = pytest.mark.docker

AGENTS = [AgentSpec(f"c{i}", f"dc{1 + i // 2}", f"msb{i}", f"rack{i}", cpus=2.0, memory_mb=1024) for i in range(4)]
HEARTBEAT_TIMEOUT = 3.0
NOTICE = 60.0
POLICY = {"min": 1, "max": 3, "target_cpu": 0.5, "tolerance": 0.1, "predictive": False, "scale_down_after": 600,
          "max_changes_per_hour": 60}


@pytest.fixture(scope="module")
def region(tmp_path_factory, docker_client):
    yield from running_region(Region(tmp_path_factory.mktemp("capacity"), AGENTS, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                                     controld_args=("--srm-interval", "2", "--usage-sample", "1")))


@pytest.fixture(autouse=True)
def tidy(region):
    yield from tidy_after(region)


class Batch(TaskController):
    """Acks every reclaim it has had a notice of; nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.notices: dict[str, dict] = {}
        self.acked: list[str] = []

    def decide(self, request):
        self.notices.update({n.id: n.raw for n in request.notices})
        acks = [op for op in request.ops if op.kind == "reclaim" and any(op.index in n.tasks for n in request.notices)]
        self.acked += [op.id for op in acks]
        return acks


def test_batch_gives_its_machines_back_with_notice_and_a_lost_msb_is_absorbed(region, api):
    api.ok("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 4, "profile": "web"})
    api.ok("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 4, "profile": "batch",
                                        "kind": "opportunistic", "notice": NOTICE,
                                        "allow_controller_networks": ["127.0.0.0/8"]})
    task = {"image": TEST_IMAGE, "command": BURN, "cpus": 0.2, "memory_mb": 600}  # one task a machine (memory)
    names = {region.machine_id(a.name): a.name for a in AGENTS}
    load = Load(region)
    load.knobs = {"web/api": False, "batch/work": False}
    controller = Batch()

    def kernel(mid: str) -> tuple[str, str]:
        return tuple(region.netns_exec(names[mid], "cat", path).stdout.strip() for path in (SOMAXCONN, SLOW_START))

    def where() -> dict[str, str]:
        """machine -> the entitlement whose task runs there with its profile applied"""
        machines = {m["id"]: m for m in api.ok("GET", "/v1/machines")["machines"]}
        out = {}
        for h in ("web/api", "batch/work"):
            for t in api.job(h)["tasks"]:
                ent = h.split("/")[0]
                if t["state"] == "running" and machines[t["machine"]]["profile"]["applied"] == ent:
                    out[t["machine"]] = ent
        return out

    def wait(pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while not (got := pred()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {where()}\n"
                                     f"{api.ok('GET', '/v1/capacity')}\n{region.logs('controld')[-3000:]}")
            time.sleep(0.5)
        return got

    with Background(controller) as url:
        api.ok("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": task, "autoscale": POLICY})
        api.wait_running("web/api")
        api.ok("POST", "/v1/jobs", {"entitlement": "batch", "name": "work", "count": 3, "task": task, "controller": url})
        load.start()
        try:
            before = wait(lambda: (w := where()) and sorted(w.values()) == ["batch", "batch", "batch", "web"] and w,
                          120, "web on one machine, batch on the three others")
            # day: web is busy; the SRM grows it to 3 and its new tasks find no machine but batch's
            load.knobs = {"web/api": True, "batch/work": False}
            began = time.time()
            day = wait(lambda: (w := where()) and sorted(w.values()) == ["batch", "web", "web", "web"] and w,
                       240, "web on three machines, batch on one")
            took = time.time() - began
            taken = sorted(m for m, ent in day.items() if ent == "web" and before.get(m) == "batch")
            assert len(taken) == 2, (before, day)
            cap = wait(lambda: (c := api.ok("GET", "/v1/capacity")) and not c["open"] and c, 30, "the reclaims over")
            over = [r for r in cap["recent"] if r["heir"] == "web"]
            assert sorted(m for r in over for m in r["machines"]) == taken, cap
            assert all(r["entitlement"] == "batch" and r["cause"] == "demand" for r in over), cap
            # batch's controller heard of each reclaim before it acked, and acked long before the deadline
            assert {r["id"] for r in over} <= set(controller.notices), (over, controller.notices)
            assert all(n["kind"] == "reclaim" and n["deadline"] - n["start"] == pytest.approx(NOTICE)
                       for n in controller.notices.values()), controller.notices
            assert all(r["end"] < r["deadline"] for r in over), over
            for mid, ent in day.items():
                somaxconn, slow_start = kernel(mid)
                assert (somaxconn == "16384") == (ent == "web") and (slow_start == "0") == (ent == "batch"), \
                    (mid, ent, somaxconn, slow_start)
            assert not load.both, f"a machine ran tasks of web and batch at once: {load.both}"
            print(f"\nbefore: {before}\nday: {day}\nweb's growth to 3 tasks on batch's machines: {took:.0f} s; "
                  f"reclaims: {[(r['id'], round(r['end'] - r['start'], 1)) for r in over]}")

            # web's MSB lost: its task there runs again on batch's last machine, taken without notice
            lost = next(m for m, ent in day.items() if ent == "web")
            msb = next(a.msb for a in AGENTS if a.name == names[lost])
            batch_machine = next(m for m, ent in day.items() if ent == "batch")
            region.kill_msb(msb)
            cut = time.time()
            after = wait(lambda: (w := where()) and sorted(w.values()) == ["web", "web", "web"] and lost not in w and w,
                         120, "web's three tasks running without the lost MSB")
            again = time.time() - cut
            assert after.get(batch_machine) == "web", (day, after)
            cap = wait(lambda: (c := api.ok("GET", "/v1/capacity")) and not c["open"] and c, 30, "the reclaim over")
            failure = [r for r in cap["recent"] if r["cause"] == "failure"]
            assert [r["machines"] for r in failure] == [[batch_machine]] and failure[0]["deadline"] == failure[0]["start"], \
                cap
            assert kernel(batch_machine)[0] == "16384"
            assert not load.both, f"a machine ran tasks of web and batch at once: {load.both}"
            print(f"msb {msb} lost: web's task running again on {batch_machine} after {again:.1f} s "
                  f"(heartbeat timeout {HEARTBEAT_TIMEOUT:g} s)")
            assert again <= HEARTBEAT_TIMEOUT + 5.0, again  # the bound
            region.heal_msb(msb)
            api.wait_machines(lambda ms: all(m["healthy"] for m in ms), 60, "the MSB's machine back")
        finally:
            load.stop.set()
            load.join(10)
