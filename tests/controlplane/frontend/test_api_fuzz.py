"""Schemathesis against the served OpenAPI document (issue #11): every check, three API credentials
(admin, owner of one entitlement, reader) on the API, and the agents' two (a machine's credential
on its endpoints, a bootstrap token on registration), a real controld on real etcd with an etcd snapshot
around every refused request (fuzz_hooks.py). 0 server errors, 0 schema violations, 0 writes by a
refused request. The figures are printed (pytest -s)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.agentproc import REPO
from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import TASK, register

EXAMPLES = int(os.environ.get("TWINE_FUZZ_EXAMPLES", "15"))
CONFIG = """
[checks.positive_data_acceptance]
# 422: a body the schema allows that the region cannot take as it is (quota, no such machine, ...)
expected-statuses = ["2XX", 401, 403, 404, 409, 422]

[checks.negative_data_rejection]
# 413: a body over the 1 MiB limit is refused before its schema is looked at
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422]

# DELETE /v1/jobs/{ent}/{name} answers 202: the job stops its tasks and stays readable, `stopping`
# then `stopped` (docs/api.md), as a Kubernetes object with finalizers stays readable until they are
# done; a read of it after the delete is no use after free (schemathesis takes any 2XX as gone)
[[operations]]
include-path-regex = "^/v1/jobs/"
include-method = "GET"
checks.use_after_free.enabled = false
"""


@pytest.fixture(scope="module")
def region(tmp_path_factory, etcd_server):
    tmp = tmp_path_factory.mktemp("fuzz")
    # a long poll waits at most a second (--max-long-poll): what it answers is fuzzed, not its wait;
    # the SRM, which sizes the fuzzed jobs' autoscale policies by itself, passes once an hour, and
    # so do the profile rollouts' steps (a PATCH begins one in its own write): a write of theirs
    # between a request and its check would be taken for the request's
    c = Controld(tmp, etcd_server.port, heartbeat_timeout=3600,
                 extra=("--max-long-poll", "1", "--srm-interval", "3600", "--rollout-interval", "3600")).start()
    try:
        register(c, "m1", "dc1", "msb1", cpus=8)
        # the agents' endpoints are fuzzed as a machine with no task: what its heartbeats report
        # starts no scheduler work that could write while a later refused request is looked at
        machine = register(c, "m2", "dc1", "msb1", cpus=1)
        assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK})[0] == 201
        tokens = {"admin": API_TOKEN, "machine": machine, "bootstrap": BOOTSTRAP_TOKEN}
        for role, ents in (("owner", ["web"]), ("reader", [])):
            status, t = c.call("POST", "/v1/tokens", {"role": role, "entitlements": ents})
            assert status == 201, t
            tokens[role] = t["token"]
        yield c, tokens, tmp
    finally:
        c.close()


AGENT = "^/v1/agent/"
OPERATIONS = {  # which operations each credential is for
    "machine": ["--include-path-regex", "^/v1/agent/(desired|heartbeat|shutdown)$"],
    "bootstrap": ["--include-path-regex", "^/v1/agent/register$"],
    **{role: ["--exclude-path-regex", AGENT] for role in ("reader", "owner", "admin")},
}


# admin last: its stateful phase revokes tokens and releases machines
@pytest.mark.parametrize("role", ["machine", "bootstrap", "reader", "owner", "admin"])
def test_the_served_document_holds_under_schemathesis(region, etcd_server, role):
    c, tokens, tmp = region
    config = tmp / "schemathesis.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.controlplane.fuzz_hooks", "PYTHONPATH": str(REPO),
           "TWINE_FUZZ_ETCD": f"http://127.0.0.1:{etcd_server.port}", "NO_COLOR": "1",
           "TWINE_FUZZ_LOG": str(tmp / f"refused-{role}.log")}
    cmd = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run",
           c.url + "/v1/openapi.json", "--checks", "all", "-H", f"Authorization: Bearer {tokens[role]}",
           "--max-examples", str(EXAMPLES), "--workers", "1", "--seed", "20261123",
           *OPERATIONS[role], "--suppress-health-check", "all", "--no-color"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp)
    out = p.stdout
    (tmp / f"schemathesis-{role}.txt").write_text(out + p.stderr)
    summary = re.search(r"Test cases:\s*\n\s*(.+)", out)
    log = tmp / f"refused-{role}.log"
    refused = log.read_text().splitlines() if log.exists() else []
    hourly = [line for line in refused if " hourly " in line]  # an hour's end during the run (fuzz_hooks.py)
    print(f"\n[{role}] {summary.group(1).strip() if summary else '?'}; {len(refused)} refused requests, etcd "
          f"unchanged around each{f' but for the hourly history records in {len(hourly)}: {hourly[:3]}' if hourly else ''}; "
          f"{out.strip().splitlines()[-1] if out else ''}")
    assert p.returncode == 0, out[-12000:] + p.stderr[-2000:]
    assert "Authentication failed" not in out or role != "admin", "the credential no longer works"
    assert len(refused) > (30 if role in ("machine", "bootstrap") else 100), \
        "the etcd check saw too few refused requests to mean anything"
