"""The API over TLS, for real: twine-controld with a certificate from a throwaway CA (openssl), and
twinectl, an agent's control-plane client and a second replica that verify it against that CA."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import urllib.request

import aiohttp
import pytest

from agent.config import AgentConfig, Labels
from agent.controlplane_client import ControlPlaneClient
from agent.report import machine_info
from agent.tls import client_context
from controlplane.cli import twinectl
from controlplane.store.etcdproc import EtcdServer
from controlplane.security.pki import CA
from tests.etcd_server import read_as
from tests.agent.agentproc import REPO, free_port
from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import TASK, register


@pytest.fixture
def ca(tmp_path):
    return CA(tmp_path / "pki")


def tls_flags(pair, ca: CA) -> tuple[str, ...]:
    return ("--tls-cert", str(pair.cert), "--tls-key", str(pair.key), "--tls-ca", str(ca.cert))


@pytest.fixture
def controld(tmp_path, etcd_server, ca):
    c = Controld(tmp_path, etcd_server.port, extra=tls_flags(ca.issue("controld"), ca), ca=ca.cert).start()
    yield c
    c.close()


def test_twinectl_and_agents_verify_the_daemon_and_plain_http_is_not_served(controld, ca, tmp_path, capsys):
    assert controld.url.startswith("https://")
    assert controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201

    # twinectl: with the CA it works; without it, it says whom it cannot trust and how to fix it
    assert twinectl.main(["--url", controld.url, "--ca", str(ca.cert), "--token", API_TOKEN, "--json",
                          "entitlement", "list"]) == 0
    assert '"web"' in capsys.readouterr().out
    assert twinectl.main(["--url", controld.url, "--token", API_TOKEN, "entitlement", "list"]) == 3
    err = capsys.readouterr().err
    assert "cannot trust twine-controld" in err and "--ca" in err, err
    assert twinectl.main(["--url", controld.url, "--ca", str(tmp_path / "nope.pem"), "--token", API_TOKEN,
                          "entitlement", "list"]) == 2
    assert "nope.pem: no such file" in capsys.readouterr().err

    # the agent's client registers and heartbeats over TLS, verifying against the CA
    async def agent() -> None:
        cfg = AgentConfig(machine_id="m1", state_dir=tmp_path, labels=Labels(region=controld.region))
        client = ControlPlaneClient(controld.url, BOOTSTRAP_TOKEN, tmp_path, machine_info(cfg),
                                    tls=client_context(ca.cert))
        try:
            await client.register()
            await client.heartbeat({"desired_version": "", "health": {}, "profile": {"name": None, "ok": True},
                                    "tasks": []})
        finally:
            await client.close()

    asyncio.run(agent())

    async def agent_with_another_ca() -> None:  # the same client, a CA the daemon's certificate is not from
        cfg = AgentConfig(machine_id="m2", state_dir=tmp_path / "m2", labels=Labels(region=controld.region))
        client = ControlPlaneClient(controld.url, BOOTSTRAP_TOKEN, tmp_path / "m2", machine_info(cfg),
                                    tls=client_context(CA(tmp_path / "other").cert))
        try:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await client.register()
        finally:
            await client.close()

    asyncio.run(agent_with_another_ca())
    machine = controld.call("GET", "/v1/machines/m1")[1]
    assert machine["id"] == "m1" and machine["healthy"], machine

    # nothing answers in plain HTTP on the TLS port
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{controld.port}/healthz", timeout=5).read()


def test_a_second_replica_forwards_to_the_leader_over_verified_tls(controld, ca, tmp_path, etcd_server):
    """A job created on a replica that does not lead the shard is forwarded to the leader, over TLS."""
    (tmp_path / "b").mkdir()
    follower = Controld(tmp_path / "b", etcd_server.port, region=controld.region, ca=ca.cert,
                        extra=tls_flags(ca.issue("controld-b"), ca)).start(wait_led=False)
    try:
        register(controld, "m1", "dc1", "msb1")
        assert controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        follower.wait_for("/v1/entitlements", lambda b: [e["name"] for e in b["entitlements"]] == ["web"])
        status, job = follower.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK})
        assert status == 201, job
        assert job["tasks"][0]["machine"] == "m1"
        # the leader acted on it (its audit line), the follower only passed it on (none)
        def posts(c: Controld) -> list[str]:
            return [line for line in c.log.read_text().splitlines() if "twine.audit" in line and "POST /v1/jobs" in line]
        assert len(posts(controld)) == 1 and posts(controld)[0].endswith("-> 201"), posts(controld)
        assert posts(follower) == []
    finally:
        follower.close()


def test_unusable_tls_files_and_keys_others_may_read_are_exit_2_naming_the_file(tmp_path, etcd_server, ca):
    pair = ca.issue("controld")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    open_key = tmp_path / "group-readable-key.pem"  # a private key its group may read (chmod 640)
    open_key.write_bytes(pair.key.read_bytes())
    open_key.chmod(0o640)
    for name in ("t", "b"):
        (tmp_path / name).write_text(name + "\n")
        (tmp_path / name).chmod(0o600)
    base = [sys.executable, "-m", "controlplane.daemon", "--etcd", f"127.0.0.1:{etcd_server.port}",
            "--listen", f"127.0.0.1:{free_port()}", "--api-token-file", str(tmp_path / "t"),
            "--bootstrap-token-file", str(tmp_path / "b")]
    for flags, said in ((["--tls-cert", str(pair.cert)], "give both or neither"),
                        (["--tls-cert", str(garbage), "--tls-key", str(pair.key)], "garbage.pem"),
                        (["--tls-cert", str(pair.cert), "--tls-key", str(tmp_path / "missing")], "missing"),
                        (["--tls-ca", str(garbage)], "garbage.pem: not a usable PEM file"),
                        (["--tls-cert", str(pair.cert), "--tls-key", str(open_key)],
                         f"--tls-key: {open_key}: mode 0640 lets others than its owner read or write it"),
                        (["--etcd-ca", str(ca.cert), "--etcd-cert", str(pair.cert), "--etcd-key", str(open_key)],
                         f"--etcd-key: {open_key}: mode 0640 lets others"),
                        (["--etcd-ca", str(ca.cert), "--etcd-cert", str(pair.cert), "--etcd-key", str(tmp_path / "gone")],
                         "--etcd-key: " + str(tmp_path / "gone") + ": No such file or directory")):
        p = subprocess.run([*base, *flags], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and said in p.stderr, (flags, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr


def _runs_a_region(tmp_path, etcd: EtcdServer, ca: CA, client) -> Controld:
    """A daemon with `client` as its etcd certificate writes and reads an entitlement; then stopped."""
    good = Controld(tmp_path, etcd.port, extra=("--etcd-ca", str(ca.cert), "--etcd-cert", str(client.cert),
                                                "--etcd-key", str(client.key))).start()
    try:
        assert good.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
        assert [e["name"] for e in good.call("GET", "/v1/entitlements")[1]["entitlements"]] == ["web"]
    finally:
        good.close()
    return good


def test_the_daemon_reaches_an_etcd_that_serves_tls_and_wants_client_certificates(tmp_path, ca):
    """etcd with TLS and --client-cert-auth: the daemon with the CA and its own certificate works;
    a daemon without a certificate is refused by etcd, and says so (exit 3, etcd unreachable)."""
    etcd_pair = ca.issue("etcd")
    etcd = EtcdServer(tls=(etcd_pair.cert, etcd_pair.key, ca.cert)).start()
    try:
        good = _runs_a_region(tmp_path, etcd, ca, ca.issue("twine-controld", server=False))
        (tmp_path / "anon").mkdir()
        anonymous = Controld(tmp_path / "anon", etcd.port, region=good.region, extra=("--etcd-ca", str(ca.cert)))
        anonymous.launch()
        try:
            assert anonymous.proc.wait(60) == 3
            assert "etcd unreachable" in anonymous.log.read_text()
        finally:
            anonymous.close()
    finally:
        etcd.stop()



def _etcdauth(etcd: EtcdServer, ca: CA, admin, user: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.security.etcdauth", "--endpoint", etcd.endpoint, "--ca", str(ca.cert),
                           "--cert", str(admin.cert), "--key", str(admin.key), "--user", user],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_with_etcds_auth_on_only_the_daemons_certificate_reaches_the_regions_keys(tmp_path, ca):
    """`python -m controlplane.security.etcdauth` turns etcd's auth on: the daemon's certificate (its common
    name the user) runs a region; any other certificate the same CA signed reads no key, and a
    daemon started with one exits 3 saying etcd refused it. Run again it changes nothing, and
    nobody but root may run it once auth is on."""
    etcd_pair = ca.issue("etcd")
    etcd = EtcdServer(tls=(etcd_pair.cert, etcd_pair.key, ca.cert)).start()
    try:
        root, daemon, intruder = (ca.issue(n, server=False) for n in ("root", "twine-controld", "intruder"))
        first = _etcdauth(etcd, ca, root, "twine-controld")
        assert first.returncode == 0, first.stderr
        assert "user twine-controld added" in first.stdout and "auth enabled" in first.stdout, first.stdout
        again = _etcdauth(etcd, ca, root, "twine-controld")
        assert again.returncode == 0 and again.stdout.splitlines() == ["etcdauth: auth enabled (a no-op when it was)"]
        taken = _etcdauth(etcd, ca, daemon, "intruder")  # the daemon's own user is no admin
        assert taken.returncode == 3 and "PERMISSION_DENIED" in taken.stderr, taken.stderr
        unknown = _etcdauth(etcd, ca, intruder, "intruder")
        assert unknown.returncode == 3 and "user name not found" in unknown.stderr, unknown.stderr

        good = _runs_a_region(tmp_path, etcd, ca, daemon)
        region_key = f"/twine/{good.region}/".encode()
        assert read_as(etcd.endpoint, ca.cert, daemon, region_key) == "ok"
        assert read_as(etcd.endpoint, ca.cert, daemon, b"/elsewhere") == "PERMISSION_DENIED"
        assert read_as(etcd.endpoint, ca.cert, intruder, region_key) == "PERMISSION_DENIED"
        assert read_as(etcd.endpoint, ca.cert, root, region_key) == "ok"

        (tmp_path / "intruder").mkdir()
        other = Controld(tmp_path / "intruder", etcd.port, region=good.region,
                         extra=("--etcd-ca", str(ca.cert), "--etcd-cert", str(intruder.cert), "--etcd-key", str(intruder.key)))
        other.launch()
        try:
            assert other.proc.wait(60) == 3
            log = other.log.read_text()
            assert "permission denied" in log and "controlplane.security.etcdauth" in log and "Traceback" not in log, log[-2000:]
        finally:
            other.close()
    finally:
        etcd.stop()


def _subjects(ctx) -> list[str]:
    return [dict(kv for rdn in c["subject"] for kv in rdn).get("commonName", "") for c in ctx.get_ca_certs()]


def test_a_client_given_the_regions_ca_trusts_that_ca_alone(ca):
    """--ca / control_plane_ca: the region's CA is the only one (kubectl's certificate-authority);
    the system's CAs are for a client given none."""
    assert _subjects(client_context(ca.cert)) == _subjects(ssl.create_default_context(cafile=str(ca.cert)))
    assert len(client_context(ca.cert).get_ca_certs()) == 1
    assert len(client_context(None).get_ca_certs()) > 1  # the system's (Debian's ca-certificates)


def test_the_agent_run_makes_the_regions_ca_its_default_trust_before_aiohttp_is_imported(ca, tmp_path, monkeypatch):
    """`twine-agent run` with control_plane_ca: a default context made in the process (as aiohttp
    makes one when imported) trusts the region's CA alone; an SSL_CERT_FILE set outside is kept."""
    from agent import cli
    import agent.daemon

    seen = []

    def run_daemon(config):
        seen.append((os.environ.get("SSL_CERT_FILE"), len(ssl.create_default_context().get_ca_certs())))
        return 0

    monkeypatch.setattr(agent.daemon, "run_daemon", run_daemon)
    monkeypatch.setenv("SSL_CERT_FILE", "")
    monkeypatch.delenv("SSL_CERT_FILE")  # (absent again at the end, whatever the run set)
    config = tmp_path / "agent.toml"
    config.write_text(f'control_plane = ["https://127.0.0.1:1"]\ncontrol_plane_ca = "{ca.cert}"\n'
                      f'state_dir = "{tmp_path / "state"}"\n')
    assert cli.main(["--config", str(config), "run"]) == 0
    assert seen == [(str(ca.cert), 1)]
    other = CA(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", str(other.cert))
    assert cli.main(["--config", str(config), "run"]) == 0
    assert seen[-1] == (str(other.cert), 1)
