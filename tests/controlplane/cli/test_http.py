"""twinectl over HTTP against ContractServer, a protocol stand-in for twine-controld, for what the
real daemon cannot be made to answer on purpose: a proxy's HTML 502, a 500, an answer of an
unknown shape, a daemon too slow to answer, a rollout's progress one poll at a time. Everything
else twinectl does is tested against the real daemon (test_against_daemon.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli import twinectl, wait
from controlplane.cli.api import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_UNREACHABLE,
)
from tests.controlplane.cli import samples
from tests.controlplane.cli.contract_server import ContractServer
from tests.controlplane.cli.test_specfile import TOML_SPEC, YAML_SPEC


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
    monkeypatch.setattr(wait, "POLL_INTERVAL", 0.02)
    _server.reset()
    return _server


def ctl(server, *argv, token=True):
    auth = ["--token", server.token] if token is True else (["--token", token] if token else [])
    return twinectl.main(["--url", server.url, *auth, *argv])


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


def test_the_one_call_commands_send_their_method_and_path_with_the_argument(server, capsys):
    """twinectl's commands that are one API call each (commands.py _one_call): the method, and
    the path with the argument put into it; the answer shown."""
    cases = [
        (("machine", "clean", "m-002"), "POST", "/v1/machines/m-002/clean", samples.MACHINE_DETAIL),
        (("machine", "show", "m-001"), "GET", "/v1/machines/m-001", samples.MACHINE_DETAIL),
        (("token", "revoke", "tok1"), "DELETE", "/v1/tokens/tok1", {"revoked": "tok1"}),
        (("maintenance", "end", "mx1"), "POST", "/v1/maintenance/mx1/end", None),
    ]
    for argv, method, path, answer in cases:
        server.reply(method, path, 200, answer if answer is not None else {"id": "mx1"})
        ctl(server, *argv)
        assert (server.requests[-1].method, server.requests[-1].path) == (method, path), argv
    assert "token tok1 revoked" in capsys.readouterr().out
