"""twinectl's pure parts: exit codes, error messages, arguments, the --wait conditions."""

from __future__ import annotations

import pytest

from controlplane.cli import twinectl
from controlplane.cli.api import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_UNAUTHORIZED,
    ApiError,
    error_message,
    exit_code_for_status,
    split_handle,
)
from controlplane.cli.wait import rollout_progress, stop_progress
from tests.controlplane.cli import samples


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for name in ("TWINE_URL", "TWINE_TOKEN", "TWINE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("status, code", [
    (200, EXIT_OK), (201, EXIT_OK), (202, EXIT_OK),
    (400, EXIT_INPUT),
    (401, EXIT_UNAUTHORIZED), (403, EXIT_UNAUTHORIZED),
    (404, EXIT_FAILED), (409, EXIT_FAILED), (422, EXIT_FAILED),
    (500, EXIT_FAILED), (502, EXIT_FAILED), (503, EXIT_FAILED),
])
def test_exit_code_for_status(status, code):
    assert exit_code_for_status(status) == code
    if status >= 400:
        assert ApiError(status, None).code == code


def test_error_message_from_the_error_body():
    assert error_message(422, samples.error("quota", "count", "needs 5 machines, quota leaves 2")) == "count: needs 5 machines, quota leaves 2"
    assert error_message(404, samples.error("not_found", None, "no job web/x")) == "no job web/x"
    assert error_message(409, {"error": "conflict"}) == "conflict (HTTP 409)"
    assert error_message(502, None, "<html>\n<b>Bad Gateway</b></html>") == "HTTP 502: <html> <b>Bad Gateway</b></html>"
    assert error_message(500, None, "") == "HTTP 500"


def test_split_handle():
    assert split_handle("web/frontend") == "web/frontend"
    assert split_handle("web/a b") == "web/a%20b"
    for bad in ("web", "/x", "web/", "a/b/c"):
        with pytest.raises(twinectl.CliError) as e:
            split_handle(bad)
        assert e.value.code == EXIT_INPUT


def test_rollout_progress():
    assert rollout_progress(samples.JOB_RUNNING) == (True, "3 of 3 tasks running at spec version 2")
    assert rollout_progress(samples.JOB_ROLLING) == (False, "1 of 3 tasks running at spec version 2; 1 at an older "
                                                            "version, 1 down")
    waiting = {**samples.JOB_ROLLING, "taskcontrol": {"pending": ["update 1", "update 2"]},
               "operations": {"rate_limited": 1}}
    assert rollout_progress(waiting)[1].endswith("1 down, 2 waiting for the TaskController, 1 held by rate limits")
    shrinking = samples.job([samples.task(0), samples.task(1, state="stopping")], count=1)
    assert rollout_progress(shrinking) == (False, "1 of 1 tasks running at spec version 2; 1 more still to stop")
    shrunk = samples.job([samples.task(0), samples.task(1, state="stopped")], count=1)
    assert rollout_progress(shrunk)[0]
    assert rollout_progress(samples.job([], count=0))[0]
    assert rollout_progress(samples.job([samples.task(0)], count=1, state="stopping")) == (False, "the job is stopping")
    # a scale-in that chose tasks 1 and 2 (the SRM): tasks 0 and 3 are the job's, gaps 1 and 2 are not
    gapped = {**samples.job([samples.task(0), samples.task(1, state="stopping"), samples.task(3)], count=2),
              "gaps": [1, 2]}
    assert rollout_progress(gapped) == (False, "2 of 2 tasks running at spec version 2; 1 more still to stop")
    gapped["tasks"] = [samples.task(0), samples.task(3)]
    assert rollout_progress(gapped) == (True, "2 of 2 tasks running at spec version 2")


def test_stop_progress():
    assert stop_progress(samples.job([], state="stopped")) == (True, "state stopped")
    assert stop_progress(samples.job([samples.task(0, state="stopping")], state="stopping")) == (False, "state stopping")


@pytest.mark.parametrize("argv", [
    ["job"],                                              # no action
    ["job", "resize", "web/frontend", "-1"],              # a negative count
    ["job", "resize", "web/frontend", "three"],
    ["job", "run", "x.yaml", "--wait", "soon"],
    ["entitlement", "create", "web", "--quota", "3"],     # --machine-type is required
    ["entitlement", "create", "web", "--machine-type", "c2", "--quota", "3", "--spread", "dc,,msb"],
    ["--timeout", "-1", "events"],
    ["nonsense"],
])
def test_bad_arguments_are_exit_2(argv, capsys):
    assert twinectl.main(argv) == EXIT_INPUT
    assert "usage: twinectl" in capsys.readouterr().err


@pytest.mark.parametrize("argv, why", [
    (["--url", "localhost:8080", "events"], "--url: 'localhost:8080' is not an http(s) URL"),
    (["--url", "ftp://x", "events"], "is not an http(s) URL"),
    (["--token", "a", "--token-file", "/x", "events"], "give --token or --token-file, not both"),
    (["--token-file", "/nonexistent/token", "events"], "--token-file /nonexistent/token: cannot read: No such file"),
    (["job", "status", "frontend"], "'frontend' is not a job handle <entitlement>/<name>"),
    (["entitlement", "modify", "web"], "nothing to change"),
])
def test_bad_settings_are_exit_2_before_any_request(argv, why, capsys):
    # --url points nowhere: had a request been made, this would be exit 3.
    argv = ["--url", "http://127.0.0.1:9"] + argv if "--url" not in argv else argv
    assert twinectl.main(argv) == EXIT_INPUT
    assert why in capsys.readouterr().err


def test_empty_token_file_is_exit_2(tmp_path, capsys):
    (tmp_path / "token").write_text("# no token here\n\n")
    assert twinectl.main(["--token-file", str(tmp_path / "token"), "events"]) == EXIT_INPUT
    assert "holds no token" in capsys.readouterr().err


def test_help_is_exit_0(capsys):
    assert twinectl.main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "Exit codes" in out and "discovery" in out
