"""Secret task environment (issue #11): the API never shows a secret value (names only, with null
values); the agent of the machine that runs the task receives it in the task's environment, and
no other agent does; an update that sends the nulls back keeps the values."""

from __future__ import annotations

import json

from agent.atomic import write_json
from tests.controlplane.test_controld_api import TASK, controld, register  # noqa: F401 - a fixture

SECRET = "s3cr3t-Value-9f2c"


def job_spec(**task) -> dict:
    return {"entitlement": "web", "name": "api", "count": 1, "task": {**TASK, **task}}


def test_secret_values_reach_the_running_agent_only(controld):
    c = controld
    creds = {m: register(c, m, "dc1", f"msb-{m}") for m in ("m1", "m2")}
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
    status, job = c.call("POST", "/v1/jobs", job_spec(env={"MODE": "prod"}, secret_env={"DB_PASSWORD": SECRET}))
    assert status == 201, job
    assert job["task"]["secret_env"] == {"DB_PASSWORD": None} and job["task"]["env"] == {"MODE": "prod"}
    shown = [job, c.call("GET", "/v1/jobs/web/api")[1], c.call("GET", "/v1/jobs")[1],
             c.call("GET", "/v1/discovery/web/api")[1], c.call("GET", "/v1/entitlements/web")[1]]
    assert not [s for s in shown if SECRET in json.dumps(s)], "a secret value in an API answer"

    mid = job["tasks"][0]["machine"]
    other = "m2" if mid == "m1" else "m1"
    desired = c.call("GET", "/v1/agent/desired?wait=0", token=creds[mid])[1]
    [task] = desired["tasks"]
    assert task["env"] == {"DB_PASSWORD": SECRET, "MODE": "prod"} and "secret_env" not in task, task
    assert SECRET not in json.dumps(c.call("GET", "/v1/agent/desired?wait=0", token=creds[other])[1])

    # the job sent back as read keeps its secret; nothing changed, so no new spec version
    read = c.call("GET", "/v1/jobs/web/api")[1]
    back = {k: read[k] for k in ("entitlement", "name", "count", "task")}
    status, same = c.call("PUT", "/v1/jobs/web/api", back)
    assert status == 200 and same["spec_version"] == job["spec_version"], same
    assert c.call("GET", "/v1/agent/desired?wait=0", token=creds[mid])[1]["tasks"][0]["env"]["DB_PASSWORD"] == SECRET
    # a new value is a new spec: a rolling update brings it to the task
    status, rotated = c.call("PUT", "/v1/jobs/web/api", job_spec(env={"MODE": "prod"}, secret_env={"DB_PASSWORD": "rotated"}))
    assert status == 200 and rotated["spec_version"] == job["spec_version"] + 1, rotated
    assert "rotated" not in json.dumps(rotated)


def test_bad_secret_env_is_a_4xx_naming_the_variable_and_writes_nothing(controld):
    """400: against the document's schema; 422: valid in itself, not with the rest of the job."""
    c = controld
    register(c, "m1", "dc1", "msb1")
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
    for task, code, field in (({"env": {"A": "1"}, "secret_env": {"A": "2"}}, 422, "task.secret_env.A"),
                              ({"secret_env": {"1BAD": "x"}}, 400, "task.secret_env.1BAD"),
                              ({"secret_env": {"A": None}}, 422, "task.secret_env.A"),
                              ({"secret_env": ["A"]}, 400, "task.secret_env"),
                              ({"env": {"A": "x" * 40000}, "secret_env": {"B": "y" * 40000}}, 422, "task.secret_env")):
        status, answer = c.call("POST", "/v1/jobs", job_spec(**task))
        assert status == code and answer["field"] == field, (task, answer)
    assert c.call("GET", "/v1/jobs")[1]["jobs"] == []
    assert c.call("POST", "/v1/jobs", job_spec())[0] == 201
    status, answer = c.call("PUT", "/v1/jobs/web/api", job_spec(secret_env={"NEW": None}))
    assert status == 422 and answer["field"] == "task.secret_env.NEW" and "has none" in answer["why"], answer


def test_a_file_the_agent_writes_is_made_owner_only_even_over_an_older_open_one(tmp_path):
    """agent.atomic.write_json, which writes the cached desired state (it holds the tasks' secret
    environment): an older file of a wider mode is replaced by one of mode 600. The agent's own
    files in a running region: tests/e2e/test_region.py."""
    path = tmp_path / "desired.json"
    path.write_text("{}")
    path.chmod(0o644)  # an older file: replaced by one of the right mode
    write_json(path, {"env": {"DB_PASSWORD": SECRET}})
    assert path.stat().st_mode & 0o777 == 0o600
