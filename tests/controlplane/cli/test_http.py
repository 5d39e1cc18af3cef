"""twinectl over HTTP against ContractServer, a protocol stand-in for twine-controld (the daemon
is written in parallel): the token, the exit codes, what is sent and what is printed."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli import twinectl
from controlplane.cli.twinectl import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_UNAUTHORIZED,
    EXIT_UNREACHABLE,
)
from tests.controlplane.cli import samples
from tests.controlplane.cli.contract_server import ContractServer
from tests.controlplane.cli.test_specfile import BODY, TOML_SPEC, YAML_SPEC


@pytest.fixture(scope="module")
def _server():
    s = ContractServer().start()
    yield s
    s.stop()


@pytest.fixture
def server(_server, monkeypatch):
    """The module's stand-in with its default answers and no recorded requests, and a
    twinectl environment pointing at it with the right token."""
    for name in ("TWINE_URL", "TWINE_TOKEN", "TWINE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(twinectl, "POLL_INTERVAL", 0.02)
    _server.reset()
    return _server


def ctl(server, *argv, token=True):
    auth = ["--token", server.token] if token is True else (["--token", token] if token else [])
    return twinectl.main(["--url", server.url, *auth, *argv])


def test_no_token_or_a_wrong_one_is_exit_4(server, capsys):
    assert ctl(server, "job", "list", token=None) == EXIT_UNAUTHORIZED
    err = capsys.readouterr().err
    assert err.startswith("twinectl: missing or wrong API token (no token given: use --token")
    assert server.requests[-1].authorization is None

    assert ctl(server, "job", "list", token="not-it") == EXIT_UNAUTHORIZED
    assert capsys.readouterr().err == "twinectl: missing or wrong API token\n"
    assert server.requests[-1].authorization == "Bearer not-it"


def test_token_from_the_environment(server, tmp_path, monkeypatch, capsys):
    (tmp_path / "token").write_text(f"# twinectl\n{server.token}\n")
    monkeypatch.setenv("TWINE_URL", server.url)
    monkeypatch.setenv("TWINE_TOKEN_FILE", str(tmp_path / "token"))
    assert twinectl.main(["entitlement", "list"]) == EXIT_OK
    assert server.requests[-1].authorization == f"Bearer {server.token}"
    monkeypatch.setenv("TWINE_TOKEN", "wrong")  # TWINE_TOKEN wins over TWINE_TOKEN_FILE ...
    assert twinectl.main(["entitlement", "list"]) == EXIT_UNAUTHORIZED
    assert twinectl.main(["entitlement", "list", "--token", server.token]) == EXIT_OK  # ... and options over both


def test_422_is_exit_1_with_field_and_why(server, capsys, tmp_path):
    (tmp_path / "job.yaml").write_text(YAML_SPEC)
    server.reply("POST", "/v1/jobs", 422, samples.error("quota", "count", "3 tasks need 3 machines; quota leaves 1"))
    assert ctl(server, "job", "run", str(tmp_path / "job.yaml")) == EXIT_FAILED
    out = capsys.readouterr()
    assert out.err == "twinectl: count: 3 tasks need 3 machines; quota leaves 1\n"
    assert out.out == ""


@pytest.mark.parametrize("status, body, code, err", [
    (400, samples.error("invalid", "task.cpus", "must be > 0"), EXIT_INPUT, "twinectl: task.cpus: must be > 0\n"),
    (404, samples.error("not_found", None, "no job web/frontend"), EXIT_FAILED, "twinectl: no job web/frontend\n"),
    (409, samples.error("conflict", "spec_version", "changed meanwhile"), EXIT_FAILED, "twinectl: spec_version: changed meanwhile\n"),
    (500, samples.error("internal", None, "etcd is unavailable"), EXIT_FAILED, "twinectl: etcd is unavailable\n"),
    (502, "<html><h1>502 Bad Gateway</h1></html>", EXIT_FAILED, "twinectl: HTTP 502: <html><h1>502 Bad Gateway</h1></html>\n"),
])
def test_error_statuses(server, capsys, status, body, code, err):
    server.reply("GET", "/v1/jobs/web/frontend", status, body)
    assert ctl(server, "job", "status", "web/frontend") == code
    assert capsys.readouterr().err == err


def test_unreachable_url_is_exit_3(capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert twinectl.main(["--url", f"http://127.0.0.1:{port}", "--token", "t", "machine", "list"]) == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert err.startswith(f"twinectl: cannot reach twine-controld at http://127.0.0.1:{port}: connection refused")


def test_a_daemon_that_does_not_answer_in_time_is_exit_3(server, capsys):
    async def slow(seen):
        await asyncio.sleep(0.5)
        return 200, samples.EVENTS

    server.on("GET", "/v1/events", slow)
    assert ctl(server, "--timeout", "0.1", "events") == EXIT_UNREACHABLE
    assert "did not answer within 0.1s" in capsys.readouterr().err


@pytest.mark.parametrize("name, text", [("job.yaml", YAML_SPEC), ("job.toml", TOML_SPEC)])
def test_job_run_posts_the_parsed_spec(server, capsys, tmp_path, name, text):
    (tmp_path / name).write_text(text)
    assert ctl(server, "job", "run", str(tmp_path / name)) == EXIT_OK
    (post,) = server.seen("POST", "/v1/jobs")
    assert post.body == twinectl.read_spec(tmp_path / name)
    if name == "job.yaml":
        assert post.body == BODY
    assert capsys.readouterr().out.startswith("job web/frontend  state=active  count=3")


def test_a_bad_spec_file_is_exit_2_and_nothing_is_sent(server, capsys, tmp_path):
    (tmp_path / "job.yaml").write_text(YAML_SPEC.replace("env: {GREETING: hello}", "env: GREETING: hello"))
    (tmp_path / "job.toml").write_text("replicas = 3\n" + TOML_SPEC)  # top level: before any [table]
    assert ctl(server, "job", "run", str(tmp_path / "job.yaml")) == EXIT_INPUT
    assert capsys.readouterr().err == (f"twinectl: {tmp_path / 'job.yaml'}: not valid YAML: line 7, column 16: "
                                       "mapping values are not allowed here\n")
    assert ctl(server, "job", "update", str(tmp_path / "job.toml")) == EXIT_INPUT
    assert "unknown key 'replicas'" in capsys.readouterr().err
    assert ctl(server, "job", "run", str(tmp_path / "missing.yaml")) == EXIT_INPUT
    assert "missing.yaml: cannot read" in capsys.readouterr().err
    assert server.requests == []


def test_json_output_is_the_daemons_json(server, capsys):
    for argv, body in [(["entitlement", "list"], samples.ENTITLEMENTS), (["job", "status", "web/frontend"], samples.JOB_RUNNING),
                       (["machine", "list"], samples.MACHINES), (["events"], samples.EVENTS),
                       (["discovery", "web/frontend"], samples.DISCOVERY)]:
        assert ctl(server, "--json", *argv) == EXIT_OK
        out = capsys.readouterr().out
        assert json.loads(out) == body
        assert out.startswith("{\n  ")  # indented
    assert ctl(server, "machine", "show", "m-001", "--json") == EXIT_OK  # the global option after the command
    assert json.loads(capsys.readouterr().out) == samples.MACHINE_DETAIL


def test_tables_over_http(server, capsys):
    assert ctl(server, "job", "status", "web/frontend") == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "job web/frontend  state=active  count=3  spec_version=2  running=3 pending=0"
    assert out[1].split() == ["INDEX", "STATE", "MACHINE", "DC", "MSB", "SPEC", "DISCOVERY", "REASON"]
    assert len(out) == 5
    assert ctl(server, "job", "list", "--entitlement", "web") == EXIT_OK
    assert server.requests[-1].query == {"entitlement": "web"}
    assert capsys.readouterr().out.splitlines()[0].startswith("HANDLE")


def test_entitlement_create_and_modify_bodies(server, capsys):
    assert ctl(server, "entitlement", "create", "web", "--machine-type", "c2.large", "--quota", "10", "--profile", "web",
               "--owner", "team-web", "--spread", "msb", "--pin-dc", "dc1") == EXIT_OK
    assert server.requests[-1].body == {"name": "web", "machine_type": "c2.large", "quota": 10, "profile": "web",
                                        "owner": "team-web", "spread": {"properties": ["msb"], "pinned_dc": "dc1"}}
    assert "entitlement:  web" in capsys.readouterr().out

    server.on("PATCH", "/v1/entitlements/web", lambda seen: (200, dict(samples.ENTITLEMENT, **seen.body)))
    assert ctl(server, "entitlement", "modify", "web", "--quota", "12", "--profile", "none") == EXIT_OK
    assert server.requests[-1].body == {"quota": 12, "profile": None}
    # only half of the spread: the other half is kept as the daemon has it
    server.reply("GET", "/v1/entitlements/web", 200, dict(samples.ENTITLEMENT_DETAIL, spread={"properties": ["msb"], "pinned_dc": None}))
    assert ctl(server, "entitlement", "modify", "web", "--pin-dc", "dc2") == EXIT_OK
    assert [(r.method, r.body) for r in server.requests[-2:]] == [
        ("GET", None), ("PATCH", {"spread": {"properties": ["msb"], "pinned_dc": "dc2"}})]


def test_update_resize_stop_send_the_right_requests(server, capsys, tmp_path):
    (tmp_path / "job.yaml").write_text(YAML_SPEC)
    server.on("PUT", "/v1/jobs/web/frontend", lambda seen: (200, dict(samples.job(), **seen.body)))
    server.reply("POST", "/v1/jobs/web/frontend/resize", 200, samples.job(count=5))
    server.reply("DELETE", "/v1/jobs/web/frontend", 202, samples.job(state="stopping"))
    assert ctl(server, "job", "update", str(tmp_path / "job.yaml")) == EXIT_OK
    assert server.requests[-1].body == BODY
    assert ctl(server, "job", "resize", "web/frontend", "5") == EXIT_OK
    assert server.requests[-1].body == {"count": 5}
    assert ctl(server, "job", "stop", "web/frontend") == EXIT_OK
    assert [(r.method, r.path) for r in server.requests] == [
        ("PUT", "/v1/jobs/web/frontend"), ("POST", "/v1/jobs/web/frontend/resize"), ("DELETE", "/v1/jobs/web/frontend")]
    assert "state=stopping" in capsys.readouterr().out


def test_wait_polls_until_every_task_runs(server, capsys, tmp_path):
    (tmp_path / "job.yaml").write_text(YAML_SPEC)
    server.sequence("GET", "/v1/jobs/web/frontend", [(200, samples.JOB_ROLLING), (200, samples.JOB_ROLLING), (200, samples.JOB_RUNNING)])
    assert ctl(server, "job", "run", str(tmp_path / "job.yaml"), "--wait", "5") == EXIT_OK
    assert len(server.seen("GET", "/v1/jobs/web/frontend")) == 3
    out = capsys.readouterr()
    assert out.out.startswith("job web/frontend  state=active  count=3  spec_version=2  running=3 pending=0\n")
    # the progress, on stderr, once a change
    assert [line.rsplit("  (", 1)[0] for line in out.err.splitlines()] == [
        "web/frontend: 1 of 3 tasks running at spec version 2; 1 at an older version, 1 down",
        "web/frontend: 3 of 3 tasks running at spec version 2"]


def test_wait_that_runs_out_is_exit_1_with_the_table(server, capsys):
    server.reply("POST", "/v1/jobs/web/frontend/resize", 200, samples.job())
    server.reply("GET", "/v1/jobs/web/frontend", 200, samples.JOB_ROLLING)
    assert ctl(server, "job", "resize", "web/frontend", "3", "--wait", "0.1") == EXIT_FAILED
    out = capsys.readouterr()
    assert out.err.splitlines()[-1] == \
        "twinectl: web/frontend: not running after 0.1s: 1 of 3 tasks running at spec version 2; 1 at an older version, 1 down"
    assert "no machine with 0.5 cpus free in msb2" in out.out  # the job's table
    assert out.out.splitlines()[2].split()[0] == "INDEX"


def test_stop_wait_until_stopped_or_gone(server, capsys):
    server.reply("DELETE", "/v1/jobs/web/frontend", 202, samples.job(state="stopping"))
    server.sequence("GET", "/v1/jobs/web/frontend", [(200, samples.job([samples.task(0, state="stopping")], state="stopping")),
                                                     (200, samples.job([], state="stopped"))])
    assert ctl(server, "job", "stop", "web/frontend", "--wait", "5") == EXIT_OK
    assert "state=stopped" in capsys.readouterr().out
    server.reply("GET", "/v1/jobs/web/frontend", 404, samples.error("not_found", None, "no job web/frontend"))
    assert ctl(server, "job", "stop", "web/frontend", "--wait") == EXIT_OK
    assert capsys.readouterr().out == "job web/frontend: stopped and removed\n"


def test_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "controlplane.cli.twinectl", "job", "status", "nohandle"],
                       check=False, capture_output=True, text=True, timeout=30, cwd=Path(__file__).parents[3])
    assert (r.returncode, r.stderr) == (EXIT_INPUT, "twinectl: 'nohandle' is not a job handle <entitlement>/<name>\n")


def test_an_answer_of_an_unexpected_shape_is_shown_as_json(server, capsys):
    server.reply("GET", "/v1/machines", 200, {"machines": ["m-001", "m-002"]})
    assert ctl(server, "machine", "list") == EXIT_OK
    out = capsys.readouterr()
    assert json.loads(out.out) == {"machines": ["m-001", "m-002"]}
    assert "cannot show this answer as a table" in out.err


def test_machine_release_posts_to_the_machine_and_shows_it(server, capsys):
    server.reply("POST", "/v1/machines/m-001/release", 200, samples.MACHINE_DETAIL)
    assert ctl(server, "machine", "release", "m-001") == EXIT_OK
    assert (server.requests[-1].method, server.requests[-1].path) == ("POST", "/v1/machines/m-001/release")
    assert "m-001" in capsys.readouterr().out
