"""The region CA (controlplane/security/pki.py) with the real openssl command."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from controlplane.security.pki import CA
from tests.agent.agentproc import REPO


def _text(cert) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-text"], capture_output=True, text=True,
                          check=True).stdout


def test_a_ca_is_never_made_anew_over_one_that_is_there(tmp_path):
    ca = CA(tmp_path / "pki")
    signed = ca.issue("controld")
    before = (ca.cert.read_bytes(), ca.key.read_bytes())
    with pytest.raises(RuntimeError, match="holds a CA already"):
        CA(tmp_path / "pki")
    assert (ca.cert.read_bytes(), ca.key.read_bytes()) == before
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(ca.cert), str(signed.cert)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_command_keeps_what_is_there_and_issues_client_certificates_for_clients(tmp_path):
    d = tmp_path / "etcd-pki"
    cmd = [sys.executable, "-m", "controlplane.security.pki", str(d), "--server", "etcd", "--ip", "127.0.0.1",
           "--client", "twine-controld", "--client", "root"]
    assert subprocess.run(cmd, cwd=REPO, capture_output=True, text=True).returncode == 0
    files = sorted(p.name for p in d.iterdir() if p.suffix == ".pem")
    assert files == ["ca-key.pem", "ca.pem", "etcd-key.pem", "etcd.pem", "root-key.pem", "root.pem",
                     "twine-controld-key.pem", "twine-controld.pem"]
    before = {n: (d / n).read_bytes() for n in files}
    assert all(stat.S_IMODE((d / n).stat().st_mode) == 0o600 for n in files if n.endswith("-key.pem"))
    client = _text(d / "twine-controld.pem")
    assert "Subject: CN = twine-controld" in client and "TLS Web Client Authentication" in client
    assert "TLS Web Server Authentication" not in client and "Subject Alternative Name" not in client
    server = _text(d / "etcd.pem")
    assert "TLS Web Server Authentication" in server and "IP Address:127.0.0.1" in server
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert {n: (d / n).read_bytes() for n in files} == before, "a second run changes no file"


def test_the_command_renews_a_certificate_near_its_end_or_of_another_ca_and_the_ca_outlives_them(tmp_path):
    d = tmp_path / "etcd-pki"
    ca = CA(d, days=1, ca_days=3650)  # issues certificates that end tomorrow
    ca.issue("etcd")
    other = CA(tmp_path / "other").issue("twine-controld", server=False)  # the wrong CA's
    (d / "twine-controld.pem").write_bytes(other.cert.read_bytes())
    (d / "twine-controld-key.pem").write_bytes(other.key.read_bytes())
    before = {n: (d / n).read_bytes() for n in ("ca.pem", "etcd.pem", "twine-controld.pem")}
    assert not ca.current("etcd") and not ca.current("twine-controld")
    run = subprocess.run([sys.executable, "-m", "controlplane.security.pki", str(d), "--server", "etcd", "--ip", "127.0.0.1",
                          "--client", "twine-controld"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"pki: issued etcd ({d}/etcd.pem, 365 days)",
                                       f"pki: issued twine-controld ({d}/twine-controld.pem, 365 days)"]
    assert (d / "ca.pem").read_bytes() == before["ca.pem"], "the CA is kept"
    assert all((d / n).read_bytes() != before[n] for n in ("etcd.pem", "twine-controld.pem"))
    assert ca.current("etcd") and ca.current("twine-controld")
    ca_end = subprocess.run(["openssl", "x509", "-checkend", str(9 * 365 * 86400), "-noout", "-in", str(ca.cert)])
    assert ca_end.returncode == 0, "the CA lasts years beyond its certificates"
