"""`twine-agent run` as a real process, with real Docker and the real kernel."""

from __future__ import annotations

import signal
import textwrap
import time

import pytest

from agent.profiles.appliers.base import HostContext
from agent.profiles.engine import Engine
from agent.reconcile import parse_time
from tests.agent.agentproc import AgentProc
from tests.conftest import TEST_IMAGE, sysctl_path

pytestmark = pytest.mark.docker

TASK = """
[[tasks]]
job = "demo/web"
index = {index}
spec_version = {version}
image = "{image}"
command = {command!r}
cpus = 0.25
memory_mb = 40
"""
LOOP = "trap 'exit 0' TERM; while true; do echo tick; sleep 1; done"


def desired(tmp_path, *tasks: dict, profile: str | None = None):
    path = tmp_path / "desired.toml"
    text = f'profile = "{profile}"\n' if profile else ""
    for t in tasks:
        text += TASK.format(**{"index": 0, "version": 1, "image": TEST_IMAGE, "command": LOOP, **t})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomically, as a config-management tool would
    return path


def running(s: dict) -> list[dict]:
    return [t for t in s["tasks"] if t["state"] == "running"]


@pytest.fixture
def agent(tmp_path, machine_id, host_files):
    host_files.save(sysctl_path("vm.swappiness"), sysctl_path("net.core.somaxconn"))
    procs: list[AgentProc] = []

    def make(path, *extra) -> AgentProc:
        p = AgentProc(tmp_path, machine_id, path, extra)
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.close()
    Engine(HostContext(), tmp_path / "state").rollback()


def test_profile_is_applied_before_any_task_starts_with_its_limits_and_labels(tmp_path, agent, docker_client, machine_id):
    (tmp_path / "p.toml").write_text('[sysctl]\n"vm.swappiness" = 31\n')
    path = desired(tmp_path, {"index": 0}, {"index": 1}, profile=str(tmp_path / "p.toml"))
    a = agent(path).start()
    s = a.wait_for(lambda s: len(running(s)) == 2, what="two running tasks")
    assert s["profile"]["applied"] == "p" and sysctl_path("vm.swappiness").read_text().strip() == "31"
    applied_at = Engine(HostContext(), a.state).current()["applied_at"]
    for t in s["tasks"]:
        c = docker_client.containers.get(t["container"]["id"])
        assert c.labels["twine.machine"] == machine_id and c.labels["twine.job"] == "demo/web"
        assert c.attrs["HostConfig"]["NanoCpus"] == 250_000_000 and c.attrs["HostConfig"]["Memory"] == 40 << 20
        assert parse_time(c.attrs["Created"]) >= applied_at  # the profile came first


def test_a_passs_containers_start_side_by_side(tmp_path, agent, docker_client):
    """Issue #12: the agent started a pass's containers one after another (each waiting for the
    previous one to run). Now they start together (at most START_CONCURRENCY at once): some
    container is created before another one's start is done. One after another, each container's
    creation would come after the start of the one created before it."""
    path = desired(tmp_path, *({"index": i} for i in range(6)))
    a = agent(path).start()
    s = a.wait_for(lambda s: len(running(s)) == 6, what="six running tasks")
    times = sorted((parse_time(c.attrs["Created"]), parse_time(c.attrs["State"]["StartedAt"]))
                   for c in (docker_client.containers.get(t["container"]["id"]) for t in s["tasks"]))
    overlapping = [i for i in range(1, len(times)) if times[i][0] < times[i - 1][1]]
    assert overlapping, f"each container was created after the previous one started: {times}"


def test_an_exit_or_a_removal_is_acted_on_at_once_not_at_the_next_periodic_pass(tmp_path, agent, docker_client):
    """Issue #12: an agent learned of an exit at its next periodic pass. It follows Docker's event
    stream: with a 60 s interval, a killed task is restarted after its 1 s backoff, and a container
    removed behind its back is replaced, each well before the interval."""
    a = agent(desired(tmp_path, {"index": 0}), "--reconcile-interval", "60").start()
    s = a.wait_for(lambda s: len(running(s)) == 1, what="the task running")
    first = s["tasks"][0]["container"]["id"]
    passes = s["counters"]["reconcile_passes"]

    docker_client.containers.get(first).kill()
    s = a.wait_for(lambda s: running(s) and running(s)[0]["container"]["id"] != first, timeout=15,
                   what="the killed task restarted")
    assert s["tasks"][0]["restarts"] == 1 and s["tasks"][0]["last_exit"]["exit_code"] == 137
    assert s["counters"]["container_events"] >= 1 and s["counters"]["reconcile_passes"] > passes

    second = s["tasks"][0]["container"]["id"]
    docker_client.containers.get(second).remove(force=True)
    s = a.wait_for(lambda s: running(s) and running(s)[0]["container"]["id"] not in (first, second), timeout=15,
                   what="the removed task's container replaced")
    assert docker_client.containers.get(s["tasks"][0]["container"]["id"]).status == "running"


def test_sigkill_and_restart_adopts_every_container_without_restarting_it(tmp_path, agent, docker_client):
    path = desired(tmp_path, {"index": 0}, {"index": 1})
    a = agent(path).start()
    s = a.wait_for(lambda s: len(running(s)) == 2)
    before = {t["container"]["id"]: docker_client.containers.get(t["container"]["id"]).attrs["State"]["StartedAt"] for t in s["tasks"]}

    assert a.kill(signal.SIGKILL) == -signal.SIGKILL
    for cid in before:  # the tasks did not notice
        assert docker_client.containers.get(cid).status == "running"

    b = agent(path).start()
    s = b.wait_for(lambda s: len(running(s)) == 2 and s["counters"]["reconcile_passes"] >= 2)
    assert sorted(s["adopted"]) == sorted(before)
    after = {t["container"]["id"]: docker_client.containers.get(t["container"]["id"]).attrs["State"]["StartedAt"] for t in s["tasks"]}
    assert after == before  # same containers, same start times
    assert s["counters"]["tasks_started"] == 0 and all(t["restarts"] == 0 for t in s["tasks"])


def test_sigterm_stops_the_agent_and_leaves_tasks_running(tmp_path, agent, docker_client):
    a = agent(desired(tmp_path, {"index": 0})).start()
    s = a.wait_for(lambda s: len(running(s)) == 1)
    assert a.kill(signal.SIGTERM) == 0
    assert docker_client.containers.get(s["tasks"][0]["container"]["id"]).status == "running"


def test_desired_state_changes_update_and_remove_tasks(tmp_path, agent, docker_client, machine_id):
    path = desired(tmp_path, {"index": 0}, {"index": 1})
    a = agent(path).start()
    s = a.wait_for(lambda s: len(running(s)) == 2)
    old = {t["index"]: t["container"]["id"] for t in s["tasks"]}

    desired(tmp_path, {"index": 0, "version": 2, "command": LOOP + " # v2"})
    s = a.wait_for(lambda s: len(s["tasks"]) == 1 and running(s) and running(s)[0]["spec_version"] == 2)
    assert s["tasks"][0]["container"]["id"] != old[0]
    ids = [c.id for c in docker_client.containers.list(all=True, filters={"label": f"twine.machine={machine_id}"})]
    assert ids == [s["tasks"][0]["container"]["id"]]  # old and removed containers are gone
    # the agent's own stops and removals are not taken for news (each would bring one more pass)
    assert a.status()["counters"]["container_events"] == 0


def test_exited_task_is_restarted_with_exit_code_and_logs_reported(tmp_path, agent):
    path = desired(tmp_path, {"index": 0, "command": "echo starting; echo about to fail; exit 3"})
    a = agent(path).start()
    s = a.wait_for(lambda s: s["tasks"][0]["restarts"] >= 1 and s["tasks"][0]["last_exit"], timeout=40)
    t = s["tasks"][0]
    assert t["last_exit"]["exit_code"] == 3
    assert t["last_exit"]["logs"][-2:] == ["starting", "about to fail"]


def test_a_task_is_steady_once_docker_says_it_runs_5_s_after_its_start_and_a_crashing_one_never(tmp_path, agent):
    """What a rollout's batch waits for (agent/report.py STEADY_AFTER): a task whose container exits
    at once reads "running" between its restarts, but is never steady."""
    path = desired(tmp_path, {"index": 0}, {"index": 1, "command": "exit 3"})
    a = agent(path).start()
    samples = []

    def look(s: dict) -> bool:
        samples.append((time.time(), {t["index"]: t for t in s["tasks"]}))
        return s["tasks"][0]["steady"] and s["tasks"][1]["restarts"] >= 2

    a.wait_for(look, timeout=40, what="task 0 steady, task 1 restarted twice")
    assert not any(tasks[1]["steady"] for _, tasks in samples), "the crashing task was never steady"
    for at, tasks in samples:
        t = tasks[0]
        if t["steady"]:
            assert at - parse_time(t["container"]["started_at"]) >= 5.0, t
    assert any(not tasks[0]["steady"] and tasks[0]["state"] == "running" for _, tasks in samples), \
        "steady came after running"


def test_bad_desired_state_file_exits_2_naming_the_field_and_changes_nothing(tmp_path, agent, docker_client, machine_id):
    (tmp_path / "p.toml").write_text('[sysctl]\n"vm.swappiness" = 31\n')
    before = sysctl_path("vm.swappiness").read_text()
    path = tmp_path / "bad.toml"
    path.write_text(f'profile = "{tmp_path}/p.toml"\n' + textwrap.dedent(f"""
        [[tasks]]
        job = "demo/web"
        index = 0
        image = "{TEST_IMAGE}"
        memory_mb = "lots"
    """))
    r = agent(path).run_to_exit()
    assert r.returncode == 2
    assert str(path) in r.stderr and "tasks[0].memory_mb" in r.stderr and "'lots'" in r.stderr
    assert sysctl_path("vm.swappiness").read_text() == before
    assert docker_client.containers.list(all=True, filters={"label": f"twine.machine={machine_id}"}) == []


def test_missing_image_exits_2_naming_the_image(tmp_path, agent, docker_client, machine_id):
    path = desired(tmp_path, {"index": 0, "image": "twine/no-such-image:9"})
    r = agent(path).run_to_exit()
    assert r.returncode == 2 and "tasks[0].image" in r.stderr and "twine/no-such-image:9" in r.stderr
    assert docker_client.containers.list(all=True, filters={"label": f"twine.machine={machine_id}"}) == []


def test_bad_file_while_running_is_rejected_and_the_last_good_state_kept(tmp_path, agent):
    path = desired(tmp_path, {"index": 0})
    a = agent(path).start()
    a.wait_for(lambda s: len(running(s)) == 1)
    path.write_text("tasks = 5\n")
    s = a.wait_for(lambda s: s["desired"]["error"])
    assert "tasks" in s["desired"]["error"] and len(running(s)) == 1


def test_health_and_metrics_endpoints(tmp_path, agent):
    a = agent(desired(tmp_path, {"index": 0})).start()
    a.wait_for(lambda s: len(running(s)) == 1 and s["health"])
    code, body = a.get("/healthz")
    assert code == 200 and body == "ok\n"
    code, body = a.get("/metrics")
    assert code == 200
    assert 'twine_agent_tasks{state="running"} 1' in body and "twine_agent_docker_up 1" in body


def test_metrics_are_prometheus_families_with_types_and_help(tmp_path, agent):
    """The agent's /metrics come from prometheus_client (issue #23): parsed by its parser, every
    family has a type and a help text, and the numbers are the agent's status."""
    from prometheus_client.parser import text_string_to_metric_families

    a = agent(desired(tmp_path, {"index": 0}, {"index": 1})).start()
    a.wait_for(lambda s: len(running(s)) == 2 and s["health"])
    code, body = a.get("/metrics")
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert {n: f.type for n, f in families.items() if f.type not in ("counter", "gauge") or not f.documentation} == {}
    kinds = {n: f.type for n, f in families.items()}
    assert kinds["twine_agent_reconcile_passes"] == "counter" and kinds["twine_agent_tasks"] == "gauge"
    tasks = {s.labels["state"]: s.value for s in families["twine_agent_tasks"].samples}
    assert tasks["running"] == 2 and tasks["failed"] == 0
    restarts = {(s.labels["job"], s.labels["index"]) for s in families["twine_agent_task_restarts"].samples}
    assert len(restarts) == 2
    assert families["twine_agent_docker_up"].samples[0].value == 1
    assert families["twine_agent_reconcile_passes"].samples[0].value >= 1


def test_profile_drift_is_reported_by_health(tmp_path, agent):
    (tmp_path / "p.toml").write_text('[sysctl]\n"vm.swappiness" = 31\n')
    a = agent(desired(tmp_path, {"index": 0}, profile=str(tmp_path / "p.toml")), "--health-interval", "0.2").start()
    a.wait_for(lambda s: s["profile"]["ready"] and s["health"] and s["health"]["ok"])
    sysctl_path("vm.swappiness").write_text("35")  # someone changed the host behind the agent's back
    s = a.wait_for(lambda s: s["health"]["profile_drift"])
    assert s["health"]["profile_drift"] == ["sysctl:vm.swappiness: is '35', wanted '31'"]
    code, body = a.get("/healthz")
    assert code == 503 and "drifted" in body


def test_listen_address_in_use_exits_3_instead_of_hanging(tmp_path, agent):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        a = agent(desired(tmp_path))
        a.port = busy.getsockname()[1]
        r = a.run_to_exit(timeout=30)
    assert r.returncode == 3 and "address already in use" in r.stderr.lower()


def _pretend_the_host_rebooted(state, containers) -> None:
    """What a reboot leaves: the kernel at its boot values, task containers exited, and an applied
    record written during another boot."""
    import json

    record_path = state / "profile-applied.json"
    record = json.loads(record_path.read_text())
    record["boot_id"] = "00000000-0000-0000-0000-000000000000"
    record_path.write_text(json.dumps(record))
    for c in containers:
        c.stop(timeout=1)


def test_after_a_reboot_the_profile_is_applied_again_before_tasks_start_with_boot_values_as_originals(
        tmp_path, agent, docker_client):
    (tmp_path / "p.toml").write_text('[sysctl]\n"vm.swappiness" = 31\n')
    sysctl_path("vm.swappiness").write_text("17")
    a = agent(desired(tmp_path, {"index": 0}, profile=str(tmp_path / "p.toml"))).start()
    s = a.wait_for(lambda s: len(running(s)) == 1)
    container = docker_client.containers.get(s["tasks"][0]["container"]["id"])
    a.kill(signal.SIGKILL)

    _pretend_the_host_rebooted(a.state, [container])
    sysctl_path("vm.swappiness").write_text("23")  # this boot's value, not the 17 of the last one

    b = agent(desired(tmp_path, {"index": 0}, profile=str(tmp_path / "p.toml"))).start()
    s = b.wait_for(lambda s: len(running(s)) == 1, what="the task running again")
    assert sysctl_path("vm.swappiness").read_text().strip() == "31"
    record = Engine(HostContext(), b.state).current()
    assert record["originals"]["sysctl:vm.swappiness"]["value"] == "23", "the original must be this boot's value"
    from agent.profiles.engine import boot_id

    assert record["boot_id"] == boot_id()
    started = docker_client.containers.get(s["tasks"][0]["container"]["id"]).attrs["State"]["StartedAt"]
    assert parse_time(started) >= record["applied_at"], "a task started before the profile was applied again"
    b.close()
    assert Engine(HostContext(), b.state).rollback().ok
    assert sysctl_path("vm.swappiness").read_text().strip() == "23"


def test_a_profile_sent_as_content_is_applied_without_a_local_file_and_an_edit_is_applied_again(
        tmp_path, agent):
    import json

    from agent.models import profile_hash

    def write(swappiness: int) -> None:
        sections = {"sysctl": {"vm.swappiness": swappiness}}
        body = {"profile": "only-on-the-control-plane",
                "profile_spec": {"name": "only-on-the-control-plane", "hash": profile_hash(sections), "sections": sections},
                "tasks": []}
        (tmp_path / "d.json.tmp").write_text(json.dumps(body))
        (tmp_path / "d.json.tmp").replace(tmp_path / "desired.json")

    write(37)
    a = agent(tmp_path / "desired.json").start()
    a.wait_for(lambda s: s["profile"]["ready"], what="the profile applied")
    assert sysctl_path("vm.swappiness").read_text().strip() == "37"
    write(38)
    a.wait_for(lambda s: sysctl_path("vm.swappiness").read_text().strip() == "38" and s["profile"]["ready"],
               what="the edited profile applied")
    assert Engine(HostContext(), a.state).current()["ref"] == "only-on-the-control-plane"


def test_cpu_limits_stay_when_the_profile_cannot_turn_the_cpu_controller_off(tmp_path, agent, docker_client):
    """The rule: a profile that turns the cgroup cpu controller off makes `cpus` a placement
    reservation only. Where it does not apply (cgroup v1 here) the limit stays; the VM tests show
    the other side on cgroup v2."""
    (tmp_path / "p.toml").write_text("[cgroup_cpu]\nenabled = false\n")
    a = agent(desired(tmp_path, {"index": 0}, profile=str(tmp_path / "p.toml"))).start()
    s = a.wait_for(lambda s: len(running(s)) == 1)
    record = Engine(HostContext(), a.state).current()
    c = docker_client.containers.get(s["tasks"][0]["container"]["id"])
    if "cgroup_cpu:enabled" in record["not_applicable"]:
        assert c.attrs["HostConfig"]["NanoCpus"] == 250_000_000
    else:
        assert c.attrs["HostConfig"]["NanoCpus"] == 0
