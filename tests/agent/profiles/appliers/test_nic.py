"""NIC link settings on the real kernel, inside a network namespace the test creates: a veth pair
there really changes MTU and queue length and is restored. No interface outside it is touched."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from agent.errors import ProfileError
from agent.profiles.appliers.base import NETNS, HostContext
from agent.profiles.appliers.nic import Nic

# Runs the applier inside the namespace (`ip netns exec`), as the agent of that namespace would.
SNIPPET = """
import json, sys
from agent.profiles.appliers.base import HostContext
from agent.profiles.appliers.nic import Nic
step, key, value = json.loads(sys.argv[1])
nic = Nic(HostContext())
out = {"applicable": repr(nic.applicable(key)), "before": nic.read(key)}
if step == "parse":
    [s] = nic.parse({key: value}, "test.toml")
    nic.check([s])
    value = s.value
nic.write(key, value)
out["verdict"] = repr(nic.verify(key, value))
print(json.dumps(out))
"""


@pytest.fixture
def netns():
    name = f"twt-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "add", "tv0", "type", "veth", "peer", "name", "tv1"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


def in_netns(ns: str, step: str, key: str, value: object) -> dict:
    run = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SNIPPET, json.dumps([step, key, value])],
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def links(ns: str) -> dict[str, dict[str, int]]:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {l["ifname"]: {"mtu": l["mtu"], "txqueuelen": l.get("txqlen")} for l in json.loads(out)}


def test_mtu_and_queue_length_change_in_the_namespace_and_read_value_restores(netns):
    original = links(netns)
    assert {"tv0", "tv1"} <= set(original)

    applied = in_netns(netns, "parse", "tv*", {"mtu": 9000, "txqueuelen": 5000})
    assert applied["applicable"] == "None"
    assert applied["verdict"] == "Holds()"
    saved = applied["before"]
    assert saved == {n: original[n] for n in ("tv0", "tv1")}
    now = links(netns)
    assert now["tv0"] == now["tv1"] == {"mtu": 9000, "txqueuelen": 5000}
    assert now["lo"] == original["lo"]  # not matched, not touched

    restored = in_netns(netns, "restore", "tv*", saved)  # what a rollback does
    assert restored["verdict"] == "Holds()"
    assert links(netns) == original


def test_pattern_matching_nothing_is_not_applicable(netns):
    run = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c",
         "from agent.profiles.appliers.base import HostContext;from agent.profiles.appliers.nic import Nic;"
         "print(Nic(HostContext()).applicable('eth*'))"],
        capture_output=True, text=True, check=True,
    )
    assert "no interface matches 'eth*' in this network namespace" in run.stdout


@pytest.mark.parametrize(
    ("value", "field", "why"),
    [
        ({"mtu": 67}, "[nic] eth* mtu", "from 68 to 65535"),
        ({"mtu": 65536}, "[nic] eth* mtu", "from 68 to 65535"),
        ({"txqueuelen": -1}, "[nic] eth* txqueuelen", "from 0 to 1000000"),
        ({"txqueuelen": 1_000_001}, "[nic] eth* txqueuelen", "from 0 to 1000000"),
        ({"mtu": True}, "[nic] eth* mtu", "integer"),
        ({"mtu": "9000"}, "[nic] eth* mtu", "integer"),
        ({"speed": 1000}, "[nic] eth*", "unknown fields speed"),
        ({}, "[nic] eth*", "must be a table"),
        (9000, "[nic] eth*", "must be a table"),
    ],
)
def test_bad_values_are_profile_errors(value, field, why):
    with pytest.raises(ProfileError) as e:
        Nic(HostContext()).parse({"eth*": value}, "test.toml")
    assert e.value.field == field and why in e.value.why


def test_scope_is_the_network_namespace():
    assert Nic(HostContext()).scope("eth*") == NETNS


def test_importing_the_applier_does_not_import_pyroute2():
    run = subprocess.run(
        [sys.executable, "-c", "import sys, agent.profiles.appliers.nic; print('pyroute2' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert run.stdout.strip() == "False"
