"""Secret task environment (issue #11): the API never shows a secret value (names only, with null
values); the agent of the machine that runs the task receives it in the task's environment, and
no other agent does; an update that sends the nulls back keeps the values."""

from __future__ import annotations

import json

from agent.atomic import write_json
from tests.controlplane.frontend.test_controld_api import TASK, controld, register  # noqa: F401 - a fixture

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


def stored(c) -> str:
    """Every record of the region as etcd holds it."""
    import asyncio

    from controlplane.store import Store

    async def read() -> str:
        store = Store([("127.0.0.1", c.etcd_port)])
        try:
            items, _ = await store.range(f"/twine/{c.region}/")
            return json.dumps({v.key: v.value for v in items})
        finally:
            await store.close()

    return asyncio.run(read())


def env_of(c, cred: str) -> dict:
    tasks = c.call("GET", "/v1/agent/desired?wait=0", token=cred)[1]["tasks"]
    return tasks[0]["env"] if tasks else {}


def test_secret_values_are_sealed_in_etcd_and_a_key_rotation_restarts_nothing(tmp_path, etcd_server):
    """With --secret-key-file (as every test daemon and installed region runs), etcd holds secret
    values sealed (AES-GCM): the job's record and each task's. Only the desired state the agent
    reads has them opened. A new key put first: the values sealed with the old one still open;
    the same value sent again changes nothing (no new spec version); a new value is sealed with
    the new key."""
    from controlplane.security.sealing import Sealer
    from tests.controlplane.controld_proc import Controld

    c = Controld(tmp_path, etcd_server.port).start()
    try:
        cred = register(c, "m1", "dc1", "msb1")
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        status, job = c.call("POST", "/v1/jobs", job_spec(secret_env={"DB_PASSWORD": SECRET}))
        assert status == 201, job
        raw = stored(c)
        assert SECRET not in raw and raw.count("twine-sealed:v1:key1:") == 2, "the job's record and its task's"
        assert env_of(c, cred) == {"DB_PASSWORD": SECRET}

        c.close()  # a new key first; the old one still listed
        old = c.key_file.read_text()
        c.key_file.write_text(Sealer.new_key_line("key2") + "\n" + old)
        c.start()
        assert env_of(c, cred) == {"DB_PASSWORD": SECRET}, "sealed with key1, opened after the rotation"
        status, same = c.call("PUT", "/v1/jobs/web/api", job_spec(secret_env={"DB_PASSWORD": SECRET}))
        assert status == 200 and same["spec_version"] == job["spec_version"], "the same value: nothing changes"
        # a change elsewhere in the template seals the unchanged value again, with the first key
        status, other = c.call("PUT", "/v1/jobs/web/api", job_spec(env={"MODE": "b"}, secret_env={"DB_PASSWORD": SECRET}))
        assert status == 200 and other["spec_version"] == job["spec_version"] + 1
        job_raw = json.loads(stored(c))[f"/twine/{c.region}/jobs/web/api"]
        assert job_raw["task"]["secret_env"]["DB_PASSWORD"].startswith("twine-sealed:v1:key2:")
        job = other
        status, new = c.call("PUT", "/v1/jobs/web/api", job_spec(env={"MODE": "b"}, secret_env={"DB_PASSWORD": "next-one"}))
        assert status == 200 and new["spec_version"] == job["spec_version"] + 1
        c.wait_for("/v1/jobs/web/api", lambda j: j["tasks"] and j["tasks"][0]["spec_version"] == new["spec_version"],
                   what="the task at the new spec")
        raw = stored(c)
        assert "next-one" not in raw and "twine-sealed:v1:key2:" in raw
        assert env_of(c, cred) == {"DB_PASSWORD": "next-one", "MODE": "b"}
        # a value in the form of a sealed one is refused, key or none
        status, refused = c.call("POST", "/v1/jobs", {**job_spec(secret_env={"T": "twine-sealed:v1:key2:AAAA"}),
                                                      "name": "forged"})
        assert status == 422 and refused["field"] == "task.secret_env.T", refused
    finally:
        c.close()


def test_a_value_whose_key_is_gone_is_a_503_that_keeps_tasks_running_and_a_value_from_before_the_key_still_reads(
        tmp_path, etcd_server):
    """Started without a key file, a daemon stores the value as given (and says so). Given a key
    later, the value reads as it is and an identical update changes nothing. A value sealed with
    a key no longer listed never reaches an agent without its secret, nor does this daemon's
    missing key stop a task: the agent's desired state is a 503 (it keeps what runs and asks
    another replica), said at start and in the log; "keep the current value" (null) is a 422
    naming the variable; sending the value again mends it."""
    from controlplane.security.sealing import Sealer
    from tests.controlplane.controld_proc import Controld

    c = Controld(tmp_path, etcd_server.port, extra=("--secret-key-file", "")).start()
    try:
        assert "no --secret-key-file" in c.log.read_text()
        cred = register(c, "m1", "dc1", "msb1")
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        status, job = c.call("POST", "/v1/jobs", job_spec(secret_env={"DB_PASSWORD": SECRET}))
        assert status == 201 and SECRET in stored(c), "no key: as given"
        c.close()
        c.extra = ()  # the default: Controld's key file
        c.start()
        assert env_of(c, cred) == {"DB_PASSWORD": SECRET}
        status, same = c.call("PUT", "/v1/jobs/web/api", job_spec(secret_env={"DB_PASSWORD": SECRET}))
        assert status == 200 and same["spec_version"] == job["spec_version"]
        status, sealed = c.call("PUT", "/v1/jobs/web/api", job_spec(secret_env={"DB_PASSWORD": "sealed-now"}))
        assert status == 200 and "sealed-now" not in stored(c)
        c.wait_for("/v1/jobs/web/api", lambda j: j["tasks"] and j["tasks"][0]["spec_version"] == sealed["spec_version"],
                   what="the task at the new spec")

        c.close()  # the key that sealed it is gone
        c.key_file.write_text(Sealer.new_key_line("other") + "\n")
        c.start()
        status, answer = c.call("GET", "/v1/agent/desired?wait=0", token=cred)
        assert status == 503 and "cannot open a secret value" in answer["why"] and "keep running" in answer["why"], answer
        log = c.log.read_text()
        assert "sealed with key(s) not in --secret-key-file: key1 (1 value(s))" in log, "said at start"
        assert "'key1', which is not in" in log
        assert c.call("GET", "/v1/machines/m1")[0] == 200, "the machine view (its desired version) still answers"
        status, refused = c.call("PUT", "/v1/jobs/web/api", {**job_spec(), "task": {**TASK, "secret_env": {"DB_PASSWORD": None}}})
        assert status == 422 and refused["field"] == "task.secret_env.DB_PASSWORD", refused
        status, mended = c.call("PUT", "/v1/jobs/web/api", job_spec(secret_env={"DB_PASSWORD": "mended"}))
        assert status == 200, mended
        c.wait_for("/v1/jobs/web/api", lambda j: j["tasks"] and j["tasks"][0]["spec_version"] == mended["spec_version"],
                   what="the task at the mended spec")
        assert env_of(c, cred) == {"DB_PASSWORD": "mended"}
    finally:
        c.close()


def test_the_key_file_is_checked_at_start(tmp_path, etcd_server):
    import subprocess
    import sys

    from tests.agent.agentproc import REPO
    from tests.controlplane.controld_proc import Controld

    c = Controld(tmp_path, etcd_server.port)
    bad = tmp_path / "keys"
    for text, mode, why in (("key1:" + "A" * 44 + "\n", 0o644, "lets others than its owner read"),
                            ("key1:not-base64!\n", 0o600, "key1: not base64"),
                            ("key1:" + "QUJD" + "\n", 0o600, "3 bytes; an AES-256 key is 32"),
                            ("# nothing\n", 0o600, "no key in it"),
                            ("bad name:QUJD\n", 0o600, "a key is NAME:BASE64")):
        bad.write_text(text)
        bad.chmod(mode)
        r = subprocess.run([sys.executable, "-m", "controlplane.daemon", "--etcd", f"127.0.0.1:{etcd_server.port}",
                            "--api-token-file", str(c.api_file), "--secret-key-file", str(bad)],
                           capture_output=True, text=True, cwd=REPO, timeout=30)
        assert r.returncode == 2 and "--secret-key-file" in r.stderr and why in r.stderr, (text, r.stderr)


def test_a_controller_token_is_sealed_in_etcd_and_reaches_its_controller_after_a_restart(tmp_path, etcd_server):
    """A job's controller_token is sealed at rest as its secret values are (bound to the job and a
    name no variable has); the shard's leader opens it for the calls. A job read and sent back keeps
    the sealed token as it is; after a restart the controller still gets the token, and a
    TaskController served with it acknowledges the update (one with another token would 401)."""
    from controlplane.taskcontrol.sdk import Background, TaskController
    from tests.controlplane.controld_proc import daemon_with_sim_agents

    class AckAll(TaskController):
        def decide(self, request):
            return request.ops

    token = "tc-" + SECRET
    # machines outlive the restart below (a slow one must not fail them: a failed task is updated
    # without asking its controller, and this test is about the call)
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2"), heartbeat_timeout=10.0) as (c, _agents), \
            Background(AckAll(), token=token) as url:
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2,
                                                 "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
        spec = {**job_spec(), "count": 2, "controller": url, "controller_token": token}
        status, job = c.call("POST", "/v1/jobs", spec)
        assert status == 201 and job["controller_token"] is None and job["controller_token_set"] is True, job
        key = f"/twine/{c.region}/jobs/web/api"
        sealed = json.loads(stored(c))[key]["controller_token"]
        assert token not in stored(c) and sealed.startswith("twine-sealed:v1:key1:"), sealed

        read = c.call("GET", "/v1/jobs/web/api")[1]
        back = {k: read[k] for k in ("entitlement", "name", "count", "task", "controller", "controller_token")}
        assert c.call("PUT", "/v1/jobs/web/api", back)[0] == 200
        assert json.loads(stored(c))[key]["controller_token"] == sealed, "the same token keeps its sealed form"

        c.close()
        c.start()
        back["task"] = {**back["task"], "env": {"V": "2"}}  # an update the controller must acknowledge
        status, updated = c.call("PUT", "/v1/jobs/web/api", back)
        assert status == 200 and updated["spec_version"] == 2, updated
        done = c.wait_for("/v1/jobs/web/api", lambda j: all(t["spec_version"] == 2 and t["state"] == "running"
                                                             for t in j["tasks"]) and len(j["tasks"]) == 2,
                          what="the update, acknowledged by the controller with the opened token")
        assert done["taskcontrol"]["ok"] is True, done["taskcontrol"]
        assert token not in stored(c)

        # a token in the form of a sealed one is refused (it would be taken for one)
        forged = {**spec, "name": "forged", "controller_token": sealed}
        status, refused = c.call("POST", "/v1/jobs", forged)
        assert status == 422 and refused["field"] == "controller_token", refused
