"""The region's daemons as systemd services on real hosts: started by systemd, restarted by it,
and never taking a task down with them."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.vm.region import CONTROL, MACHINES, REGION, guest_ip

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2700)]  # the first one brings the region up

JOB = {
    "name": "loop", "count": 2,
    "task": {"image": "twine/busybox:1", "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
             "cpus": 0.1, "memory_mb": 16},
    "preferences": [{"property": "msb", "strategy": "spread"}],
}


# Run by the control VM's twine venv as root: etcd as a client without TLS, with TLS but no
# certificate, with a certificate of etcd's CA whose user has no role, and as controld.
ETCD_PROBE = r"""
import asyncio, shutil, tempfile, urllib.request
from pathlib import Path
import grpc
from aetcd.rpc import rpc_pb2, rpc_pb2_grpc
from controlplane.security.pki import CA, Pair

pki, tls = Path("/etc/twine/etcd-pki"), Path("/etc/twine/tls")
d = Path(tempfile.mkdtemp())

async def read(pair):
    key = None if pair is None else pair.key.read_bytes()
    cert = None if pair is None else pair.cert.read_bytes()
    creds = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(), key, cert)
    async with grpc.aio.secure_channel("127.0.0.1:2379", creds) as ch:
        try:
            await rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"/twine/"), timeout=20)
            return "ok"
        except grpc.aio.AioRpcError as e:
            return e.code().name

try:  # the copy of the CA's key goes, whatever happens
    for n in ("ca.pem", "ca-key.pem"):
        shutil.copy(pki / n, d / n)
    intruder = CA.existing(d).issue("intruder", server=False)
    try:
        urllib.request.urlopen("http://127.0.0.1:2379/version", timeout=10)
        print("plain ok")
    except Exception as e:
        print("plain refused")
    for who, pair in (("anonymous", None), ("intruder", intruder),
                      ("controld", Pair(tls / "etcd-client.pem", tls / "etcd-client-key.pem"))):
        print(who, asyncio.run(read(pair)))
finally:
    shutil.rmtree(d)
"""


def token_search() -> str:
    """A shell command that lists the files of a VM holding the region's admin token."""
    token = (REGION / "api-token").read_text().strip()
    return f"grep -rlF -- {shlex.quote(token)} /tmp /etc /opt/twine /root /home 2>/dev/null"


def test_every_unit_is_active_under_systemd_and_every_machine_joined(region):
    for vm in CONTROL:
        for unit in ("etcd", "twine-controld"):
            u = region.unit(vm, unit)
            assert u["ActiveState"] == "active", (vm, unit, u)
    controld = region.unit("control", "twine-controld")
    assert controld["Type"] == "notify" and controld["WatchdogUSec"] != "0"
    assert region.ssh("control", "stat -c '%a %U' /etc/twine/api-tokens /etc/twine/bootstrap-tokens").split("\n")[:2] \
        == ["600 twine", "600 twine"]
    # etcd: TLS, client certificates, its auth on; its CA key and admin certificate root's alone
    assert region.ssh("control", "stat -c '%a %U' /etc/twine/tls/etcd-client-key.pem /etc/twine/etcd-pki/ca-key.pem "
                      "/etc/twine/etcd-pki/root-key.pem").split("\n")[:3] == ["600 twine", "600 root", "600 root"]
    probe = region.ssh("control", f"/opt/twine/venv/bin/python - <<'EOF'\n{ETCD_PROBE}\nEOF").split("\n")
    assert probe[:4] == ["plain refused", "anonymous UNAVAILABLE", "intruder PERMISSION_DENIED", "controld ok"], probe
    # the admin token and controld's key reach the control hosts alone (staged apart from the
    # rest, removed once installed); each holds the token where controld reads it, and nowhere else
    for vm in CONTROL:  # each command's last line is its exit code (an ssh that failed says nothing)
        holding = region.ssh(vm, f"{token_search()}; echo rc=$?", check=False).split()
        assert holding == ["/etc/twine/api-tokens", "rc=0"], (vm, holding)
        staged = region.ssh(vm, "ls -A /tmp/twine /tmp/twine-control 2>/dev/null; echo done", check=False).split()
        assert staged[-1:] == ["done"] and not {"api-token", "controld-key.pem", "join-key"} & set(staged), \
            (vm, staged)
    for vm in set(MACHINES) - set(CONTROL):  # a machine that is no control host holds neither
        holding = region.ssh(vm, f"{token_search()}; echo rc=$?", check=False).split()
        staged = region.ssh(vm, "ls -A /tmp/twine 2>/dev/null; ls -d /tmp/twine-control 2>/dev/null; echo done",
                            check=False).split()
        assert holding == ["rc=1"], (vm, holding)  # grep: nothing found
        assert staged[-1:] == ["done"] and not {"api-token", "controld-key.pem", "/tmp/twine-control"} & set(staged), \
            (vm, staged)
    for vm in CONTROL[1:]:  # the other members: etcd joined, a controld replica that says where it is
        assert region.unit(vm, "etcd")["ActiveState"] == "active"
        assert f'advertise = "https://{guest_ip(vm)}:7080"' in region.ssh(vm, "cat /etc/twine/controld.toml")
    for vm in MACHINES:
        agent = region.unit(vm, "twine-agent")
        assert agent["ActiveState"] == "active" and agent["Type"] == "notify" and agent["KillMode"] == "process", agent
        assert region.ssh(vm, "stat -c %a /etc/twine/bootstrap-token").strip() == "600"
        assert "cpu" in region.ssh(vm, "cat /sys/fs/cgroup/cgroup.controllers").split()
    machines = region.wait(lambda: (ms := region.machines()) and all(ms.get(vm, {}).get("healthy") for vm in MACHINES)
                           and ms, 300, "both machines registered and healthy")
    assert {vm: (machines[vm]["labels"]["dc"], machines[vm]["labels"]["msb"]) for vm in MACHINES} == \
        {"m1": ("dc1", "msb1"), "m2": ("dc2", "msb2")}
    # journald has the agent's log (no files of its own)
    assert "agent" in region.ssh("m1", "journalctl -u twine-agent --no-pager -n 50")


def test_restart_and_sigkill_of_the_agent_restart_no_container(region, tmp_path):
    ent = region.name("svc")
    region.ctl("entitlement", "create", ent, "--machine-type", "generic", "--quota", "2")
    spec = tmp_path / "job.yaml"  # JSON is YAML
    spec.write_text(json.dumps({**JOB, "entitlement": ent}))
    try:
        region.ctl("job", "run", str(spec), "--wait", "600")
        before = {vm: region.containers(vm) for vm in MACHINES}
        assert all(len(c) == 1 for c in before.values()), before
        pids = {vm: region.unit(vm, "twine-agent")["MainPID"] for vm in MACHINES}
        failures_before = [e for e in region.ctl("events")["events"] if e["kind"] == "failure"]

        # each guest's monotonic clock (µs) at the restart and the kill, and later when systemd saw the
        # new agent ready (Type=notify): how long each machine went without an agent, for the message
        down = {vm: int(float(region.ssh(vm, "cut -d' ' -f1 /proc/uptime").strip()) * 1e6) for vm in MACHINES}
        region.ssh("m1", "systemctl restart twine-agent")
        region.ssh("m2", "kill -9 $(systemctl show -p MainPID --value twine-agent)")
        for vm in MACHINES:
            region.wait(lambda: (u := region.unit(vm, "twine-agent"))["ActiveState"] == "active"
                        and u["MainPID"] not in ("0", pids[vm]), 300, f"{vm}'s agent back under systemd")
        assert region.unit("m2", "twine-agent")["NRestarts"] != "0", "systemd did not restart the killed agent"
        # back in touch with controld, and the tasks untouched: same containers, same start, no restart
        region.wait(lambda: all(region.machines()[vm]["healthy"] for vm in MACHINES), 120, "machines healthy")
        # an agent back within the heartbeat timeout is no failure: nothing was replaced
        back = {vm: (int(region.ssh(vm, "systemctl show -p ActiveEnterTimestampMonotonic --value twine-agent"))
                     - down[vm]) / 1e6 for vm in MACHINES}
        failures = [e for e in region.ctl("events")["events"] if e["kind"] == "failure"]
        assert failures == failures_before, (f"agents ready again after {back} s (the region's heartbeat timeout "
                                             f"is 40 s): {failures[len(failures_before):]}")
        job = region.ctl("job", "status", f"{ent}/loop")
        assert [(t["state"], t["reason"]) for t in job["tasks"]] == [("running", "")] * 2, job["tasks"]
        assert {vm: region.containers(vm) for vm in MACHINES} == before
    finally:
        region.ctl("job", "stop", f"{ent}/loop", "--wait", "300", check=False)


def test_a_hung_agent_is_restarted_by_the_systemd_watchdog(region):
    # SIGSTOP: the process lives but its event loop pings no more. systemd kills it after
    # WatchdogSec (60 s) and starts it again; the machine is back in touch with controld.
    before = region.unit("m1", "twine-agent")
    assert before["ActiveState"] == "active" and before["WatchdogUSec"] == "1min", before
    region.ssh("m1", f"kill -STOP {before['MainPID']}")
    after = region.wait(lambda: (u := region.unit("m1", "twine-agent"))["ActiveState"] == "active"
                        and u["MainPID"] not in ("0", before["MainPID"]) and u, 300,
                        "the hung agent restarted by systemd", every=5)
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    journal = region.ssh("m1", "journalctl -u twine-agent --no-pager -n 200 -o cat")
    assert "Watchdog timeout" in journal, journal[-2000:]
    region.wait(lambda: region.machines()["m1"]["healthy"], 120, "m1 healthy again")
