"""The sidekick sends a machine its entitlement's profile merged, with a content hash: profiles
are edited in one place (controld's profile directories), and an edit reaches the machine (as a
rollout: tests/controlplane/rollouts)."""

from __future__ import annotations

import os
import time

import pytest

from agent.errors import DesiredStateError
from agent.models import DesiredState, profile_hash
from tests.controlplane.controld_proc import Controld
from tests.controlplane.frontend.test_controld_api import register


def test_controld_sends_the_merged_profile_and_an_edit_changes_its_hash(tmp_path, etcd_server):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "base.toml").write_text('[sysctl]\n"vm.swappiness" = 30\n"net.core.somaxconn" = 1024\n')
    (profiles / "tuned.toml").write_text('[profile]\ninclude = "base"\n[sysctl]\n"vm.swappiness" = 10\n')
    c = Controld(tmp_path, etcd_server.port, extra=("--profiles", str(profiles))).start()
    try:
        cred = register(c, "m1", "dc1", "msb1")
        assert c.call("POST", "/v1/entitlements", {"name": "db", "machine_type": "generic", "quota": 1,
                                                   "profile": "tuned"})[0] == 201
        task = {"image": "twine/busybox:1", "command": ["sleep", "1"], "cpus": 0.1, "memory_mb": 16}
        assert c.call("POST", "/v1/jobs", {"entitlement": "db", "name": "x", "count": 1, "task": task})[0] == 201
        desired = c.call("GET", "/v1/agent/desired?wait=0", token=cred)[1]
        spec = desired["profile_spec"]
        assert desired["profile"] == "tuned" and spec["name"] == "tuned"
        assert spec["sections"] == {"sysctl": {"vm.swappiness": 10, "net.core.somaxconn": 1024}}
        assert spec["hash"] == profile_hash(spec["sections"])
        DesiredState.from_json(desired, "test")  # the agent's own parser takes it

        time.sleep(0.01)
        (profiles / "base.toml").write_text('[sysctl]\n"vm.swappiness" = 30\n"net.core.somaxconn" = 2048\n')
        os.utime(profiles / "base.toml")
        # the edit rolls out (controlplane/rollouts): the machine's task stops, then its desired
        # state carries the edited profile
        deadline = time.monotonic() + 30
        while (again := c.call("GET", "/v1/agent/desired?wait=0", token=cred)[1])["profile_spec"]["hash"] == spec["hash"]:
            assert time.monotonic() < deadline, again
            time.sleep(0.2)
        assert again["profile_spec"]["sections"]["sysctl"]["net.core.somaxconn"] == 2048
        assert again["profile_spec"]["hash"] == profile_hash(again["profile_spec"]["sections"])
        assert again["version"] != desired["version"] and again["tasks"] == []  # stopped while it switches
        rollout = c.call("GET", "/v1/entitlements/db/rollout")[1]
        assert rollout["from"] == f"tuned@{spec['hash'][:8]}" and rollout["to"] == f"tuned@{again['profile_spec']['hash'][:8]}"
    finally:
        c.close()


def test_a_profile_spec_that_does_not_match_its_hash_or_name_is_refused():
    sections = {"sysctl": {"vm.swappiness": 10}}
    good = {"profile": "p", "profile_spec": {"name": "p", "hash": profile_hash(sections), "sections": sections}}
    assert DesiredState.from_json(good, "t").profile_spec.sections == sections
    bad_hash = {**good, "profile_spec": {**good["profile_spec"], "hash": "0" * 64}}
    with pytest.raises(DesiredStateError, match="profile_spec.hash"):
        DesiredState.from_json(bad_hash, "t")
    with pytest.raises(DesiredStateError, match="profile_spec.name"):
        DesiredState.from_json({**good, "profile": "q"}, "t")
    with pytest.raises(DesiredStateError, match="profile_spec"):
        DesiredState.from_json({**good, "profile_spec": {"name": "p"}}, "t")
