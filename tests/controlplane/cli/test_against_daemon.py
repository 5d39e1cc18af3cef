"""twinectl against the real twine-controld (issue #12: its tests ran against a protocol stand-in
written before the daemon, which answered what the daemon does not): real etcd, a real daemon,
simulated agents (named so: no containers) that report their tasks running. Each test uses
entitlements and jobs of its own. test_http.py keeps only what a daemon cannot be made to do on
purpose (a proxy's HTML 502, an answer of an unknown shape, a daemon too slow to answer)."""

from __future__ import annotations

import json

import pytest

from controlplane.cli import twinectl, wait
from controlplane.cli.api import EXIT_FAILED, EXIT_INPUT, EXIT_OK, EXIT_UNAUTHORIZED
from tests.controlplane.cli.test_specfile import TOML_SPEC, YAML_SPEC
from tests.controlplane.controld_proc import API_TOKEN, daemon_with_sim_agents


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, etcd_server):
    with daemon_with_sim_agents(tmp_path_factory.mktemp("cli-daemon"), etcd_server.port, ("c1", "c2", "c3"),
                                heartbeat_timeout=5.0, dcs=2, cpus=2) as (c, agents):
        c.agents = agents
        yield c


@pytest.fixture(autouse=True)
def each_test_stops_its_jobs(daemon):
    """The tests share the daemon's three machines: a test's jobs are stopped after it, pass or fail."""
    yield
    for j in daemon.call("GET", "/v1/jobs")[1]["jobs"]:
        if j["state"] != "stopped":
            daemon.call("DELETE", f"/v1/jobs/{j['handle']}")
    for j in daemon.call("GET", "/v1/jobs")[1]["jobs"]:
        daemon.wait_for(f"/v1/jobs/{j['handle']}", lambda job: job["state"] == "stopped", what=f"{j['handle']} stopped")


@pytest.fixture
def ctl(daemon, monkeypatch):
    for name in ("TWINE_URL", "TWINE_TOKEN", "TWINE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(wait, "POLL_INTERVAL", 0.05)

    def run(*argv: str, token: str | None = API_TOKEN) -> int:
        return twinectl.main(["--url", daemon.url, *(["--token", token] if token else []), *argv])

    return run


def spec(tmp_path, entitlement: str, text: str = YAML_SPEC, name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text(text.replace("entitlement: web", f"entitlement: {entitlement}")
                    .replace('entitlement = "web"', f'entitlement = "{entitlement}"'))
    return path


def test_no_token_or_a_wrong_one_is_exit_4(ctl, capsys):
    assert ctl("job", "list", token=None) == EXIT_UNAUTHORIZED
    assert capsys.readouterr().err == ("twinectl: missing 'Authorization: Bearer <token>' (no token given: use --token, "
                                       "--token-file, TWINE_TOKEN or TWINE_TOKEN_FILE)\n")
    assert ctl("job", "list", token="not-it") == EXIT_UNAUTHORIZED
    err = capsys.readouterr().err
    assert err.startswith("twinectl: ") and "no token given" not in err, err


def test_job_run_wait_status_resize_stop(ctl, daemon, capsys, tmp_path):
    assert ctl("entitlement", "create", "cli1", "--machine-type", "generic", "--quota", "3") == EXIT_OK
    assert "entitlement:  cli1" in capsys.readouterr().out
    assert ctl("job", "run", str(spec(tmp_path, "cli1")), "--wait", "20") == EXIT_OK
    out = capsys.readouterr()
    assert out.out.startswith("job cli1/frontend  state=active  count=3  spec_version=1  running=3")
    assert out.err.splitlines()[-1].startswith("cli1/frontend: 3 of 3 tasks running at spec version 1")
    # the daemon placed what the file asked: spread over MSBs, the task as written
    job = daemon.call("GET", "/v1/jobs/cli1/frontend")[1]
    assert len({t["where"]["msb"] for t in job["tasks"]}) == 3
    assert job["task"]["env"] == {"GREETING": "hello"} and job["task"]["cpus"] == 0.5

    assert ctl("job", "status", "cli1/frontend") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["INDEX", "STATE", "MACHINE", "DC", "MSB", "SPEC", "DISCOVERY", "REASON"]
    assert len(lines) == 5 and all(line.split()[1] == "running" for line in lines[2:])

    assert ctl("job", "resize", "cli1/frontend", "2", "--wait", "20") == EXIT_OK
    assert "count=2" in capsys.readouterr().out
    assert len(daemon.call("GET", "/v1/jobs/cli1/frontend")[1]["tasks"]) == 2
    assert ctl("job", "stop", "cli1/frontend", "--wait", "20") == EXIT_OK
    assert "stopped" in capsys.readouterr().out


def test_a_toml_spec_and_an_update(ctl, daemon, capsys, tmp_path):
    assert ctl("entitlement", "create", "cli2", "--machine-type", "generic", "--quota", "3") == EXIT_OK
    assert ctl("job", "run", str(spec(tmp_path, "cli2", TOML_SPEC, "job.toml")), "--wait", "20") == EXIT_OK
    capsys.readouterr()
    updated = spec(tmp_path, "cli2", YAML_SPEC.replace("GREETING: hello", "GREETING: bonjour"))
    assert ctl("job", "update", str(updated), "--wait", "30") == EXIT_OK
    assert "spec_version=2" in capsys.readouterr().out
    job = daemon.call("GET", "/v1/jobs/cli2/frontend")[1]
    assert job["task"]["env"] == {"GREETING": "bonjour"}
    assert all(t["spec_version"] == 2 and t["state"] == "running" for t in job["tasks"])
    assert ctl("job", "stop", "cli2/frontend", "--wait", "20") == EXIT_OK


def test_the_daemons_refusals_are_exit_1_or_2_with_its_field_and_why(ctl, capsys, tmp_path):
    assert ctl("entitlement", "create", "cli3", "--machine-type", "generic", "--quota", "1") == EXIT_OK
    capsys.readouterr()
    big = spec(tmp_path, "cli3", YAML_SPEC.replace("cpus: 0.5", "cpus: 1.5"))  # 3 tasks of 1.5 need 3 machines
    assert ctl("job", "run", str(big)) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("twinectl: count: quota exceeded for cli3/frontend"), err  # the daemon's field and why
    assert ctl("job", "status", "cli3/nothing") == EXIT_FAILED
    assert capsys.readouterr().err == "twinectl: job: no job 'cli3/nothing'\n"
    assert ctl("entitlement", "create", "cli3b", "--machine-type", "generic", "--quota", "-1") == EXIT_INPUT
    assert "quota" in capsys.readouterr().err


def test_json_is_the_daemons_answer(ctl, daemon, capsys):
    for argv, path in [(["entitlement", "list"], "/v1/entitlements"), (["machine", "list"], "/v1/machines"),
                       (["machine", "show", "c1"], "/v1/machines/c1"), (["job", "list"], "/v1/jobs")]:
        assert ctl("--json", *argv) == EXIT_OK
        shown = json.loads(capsys.readouterr().out)
        answer = daemon.call("GET", path)[1]
        volatile = ("last_heartbeat", "agent", "etcd_revision")  # moves between the two reads
        strip = lambda d: {k: strip(v) for k, v in d.items() if k not in volatile} if isinstance(d, dict) else (  # noqa: E731
            [strip(x) for x in d] if isinstance(d, list) else d)
        assert strip(shown) == strip(answer), argv


def test_entitlement_modify_changes_what_the_daemon_holds(ctl, daemon, capsys):
    assert ctl("entitlement", "create", "cli4", "--machine-type", "generic", "--quota", "2", "--spread", "msb") == EXIT_OK
    assert ctl("entitlement", "modify", "cli4", "--quota", "3", "--pin-dc", "dc1") == EXIT_OK
    ent = daemon.call("GET", "/v1/entitlements/cli4")[1]
    assert ent["quota"] == 3 and ent["spread"] == {"properties": ["msb"], "pinned_dc": "dc1"}
    assert "entitlement:  cli4" in capsys.readouterr().out


def test_token_and_url_from_the_environment(daemon, ctl, tmp_path, monkeypatch):
    (tmp_path / "token").write_text(f"# twinectl\n{API_TOKEN}\n")
    monkeypatch.setenv("TWINE_URL", daemon.url)
    monkeypatch.setenv("TWINE_TOKEN_FILE", str(tmp_path / "token"))
    assert twinectl.main(["entitlement", "list"]) == EXIT_OK
    monkeypatch.setenv("TWINE_TOKEN", "wrong")  # TWINE_TOKEN wins over TWINE_TOKEN_FILE ...
    assert twinectl.main(["entitlement", "list"]) == EXIT_UNAUTHORIZED
    assert twinectl.main(["entitlement", "list", "--token", API_TOKEN]) == EXIT_OK  # ... and options over both


def test_events_discovery_listing_by_entitlement_and_owner_and_profile(ctl, daemon, capsys, tmp_path):
    """What the stand-in's tests covered and the ones above do not: events and discovery as the
    daemon has them, --json after the command, a job list narrowed to an entitlement, and an
    entitlement's owner and profile (none: null)."""
    assert ctl("entitlement", "create", "cli5", "--machine-type", "generic", "--quota", "3", "--owner", "team-x") == EXIT_OK
    assert ctl("entitlement", "create", "cli6", "--machine-type", "generic", "--quota", "1") == EXIT_OK
    assert daemon.call("GET", "/v1/entitlements/cli5")[1]["owner"] == "team-x"
    assert ctl("entitlement", "modify", "cli5", "--profile", "none") == EXIT_OK
    assert daemon.call("GET", "/v1/entitlements/cli5")[1]["profile"] is None
    assert ctl("job", "run", str(spec(tmp_path, "cli5")), "--wait", "20") == EXIT_OK
    capsys.readouterr()

    assert ctl("job", "list", "--entitlement", "cli6") == EXIT_OK
    assert "cli5/frontend" not in capsys.readouterr().out
    assert ctl("job", "list", "--entitlement", "cli5") == EXIT_OK
    assert "cli5/frontend" in capsys.readouterr().out
    assert ctl("discovery", "cli5/frontend", "--json") == EXIT_OK  # the global option after the command
    assert json.loads(capsys.readouterr().out) == daemon.call("GET", "/v1/discovery/cli5/frontend")[1]
    endpoints = daemon.call("GET", "/v1/discovery/cli5/frontend")[1]["endpoints"]
    assert ctl("discovery", "cli5/frontend") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "job cli5/frontend" and len(lines) == 2 + len(endpoints) == 5
    assert sorted(line.split()[1] for line in lines[2:]) == sorted(e["machine"] for e in endpoints)
    before = daemon.call("GET", "/v1/events")[1]  # an event may open between two reads: one of them
    assert ctl("--json", "events") == EXIT_OK
    assert json.loads(capsys.readouterr().out) in (before, daemon.call("GET", "/v1/events")[1])


def test_fleet_and_job_usage_show_what_the_agents_report(ctl, daemon, capsys, tmp_path):
    """Issue #25: `twinectl fleet` sums the machines per cell, `--by` fewer dimensions; `twinectl job
    usage` shows what the tasks use against what they reserve."""
    assert ctl("entitlement", "create", "fleetent", "--machine-type", "generic", "--quota", "1") == EXIT_OK
    assert ctl("job", "run", str(spec(tmp_path, "fleetent")), "--wait", "20") == EXIT_OK
    daemon.agents.task_cpu = 0.25
    try:
        daemon.wait_for("/v1/jobs/fleetent/frontend/usage", lambda u: (u["current"] or {}).get("tasks_reporting") == 3,
                        what="the three tasks reporting usage")
        capsys.readouterr()
        assert ctl("job", "usage", "fleetent/frontend", "--since", "2h", "--step", "10m") == EXIT_OK
        text = capsys.readouterr().out
        assert "cpus used/reserved:" in text and "0.75/1.5" in text and "tasks reporting:" in text, text
        assert ctl("fleet", "--by", "entitlement") == EXIT_OK
        text = capsys.readouterr().out
        row = next(line.split() for line in text.splitlines() if line.startswith("fleetent "))
        assert row[1:4] == ["1", "1", "0"] and row[4].split("/")[:2] == ["1.5", "0.75"], text
        assert "FREE POOL" in text and "LARGEST TASK" in text
        assert ctl("--json", "fleet", "--by", "dc") == EXIT_OK
        assert json.loads(capsys.readouterr().out)["by"] == ["dc"]
        assert ctl("fleet", "--by", "colour") == EXIT_INPUT
        assert "by" in capsys.readouterr().err
        assert ctl("job", "usage", "fleetent/frontend", "--since", "63d") == EXIT_INPUT  # the daemon's 400
        assert "since" in capsys.readouterr().err
        assert ctl("job", "usage", "fleetent/frontend", "--since", "3d", "--step", "5m") == EXIT_FAILED  # its 422
        assert "whole hours" in capsys.readouterr().err
    finally:
        daemon.agents.task_cpu = None


def test_job_usage_tasks_prints_each_tasks_machine_cores_and_memory(ctl, daemon, capsys, tmp_path):
    """Issue #35: `twinectl job usage HANDLE --tasks` adds a table of the job's tasks, one a row, with
    each one's own figures as its agent measured them (not the job's mean)."""
    assert ctl("entitlement", "create", "taskent", "--machine-type", "generic", "--quota", "3") == EXIT_OK
    assert ctl("job", "run", str(spec(tmp_path, "taskent")), "--wait", "20") == EXIT_OK
    figures = {0: (0.25, 40.0), 1: (1.2, 200.0), 2: (0.05, 12.0)}
    daemon.agents.task_figures = {("taskent/frontend", i): f for i, f in figures.items()}
    try:
        daemon.wait_for("/v1/jobs/taskent/frontend/usage?tasks=1",
                        lambda u: [t["cpus"] for t in u["tasks"]] == [0.25, 1.2, 0.05], what="each task's figures")
        where = {t["index"]: t["machine"] for t in daemon.call("GET", "/v1/jobs/taskent/frontend")[1]["tasks"]}
        capsys.readouterr()
        assert ctl("job", "usage", "taskent/frontend", "--tasks") == EXIT_OK
        lines = capsys.readouterr().out.splitlines()
        assert "cpus used/reserved:       1.5/1.5" in lines, lines  # the job's sum first, as without --tasks
        at = lines.index(next(line for line in lines if line.startswith("INDEX")))
        assert lines[at].split() == ["INDEX", "MACHINE", "STATE", "CPUS", "MEM", "MiB", "MEASURED"]
        rows = [line.split() for line in lines[at + 1:]]
        assert [r[:5] for r in rows] == [[str(i), where[i], "running", f"{c:g}", f"{m:g}"]
                                         for i, (c, m) in figures.items()], lines
        assert all(r[5].endswith("Z") for r in rows), rows  # when the heartbeat came (UTC)
        assert ctl("job", "usage", "taskent/frontend") == EXIT_OK
        assert "INDEX" not in capsys.readouterr().out  # asked for only
        assert ctl("--json", "job", "usage", "taskent/frontend", "--tasks") == EXIT_OK
        assert [t["memory_mb"] for t in json.loads(capsys.readouterr().out)["tasks"]] == [40, 200, 12]
    finally:
        daemon.agents.task_figures = {}
