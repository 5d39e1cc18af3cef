"""twine-controld reads its settings from a TOML config file (what the systemd unit uses); flags
override it; a bad file is exit 2 naming the key, so systemd does not restart it in a loop."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest

from controlplane.store.etcdproc import terminate
from tests.agent.agentproc import REPO, free_port


def secret(path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def run_controld(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.daemon", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def test_controld_serves_from_its_config_file_alone(tmp_path, etcd_server):
    secret(tmp_path / "api", "tok-a\n")
    secret(tmp_path / "boot", "tok-b\n")
    port = free_port()
    conf = tmp_path / "controld.toml"
    conf.write_text(f'etcd = "127.0.0.1:{etcd_server.port}"\nregion = "cfg{port}"\nlisten = "127.0.0.1:{port}"\n'
                    f'api_token_file = "{tmp_path / "api"}"\nbootstrap_token_file = "{tmp_path / "boot"}"\n'
                    f'heartbeat_timeout = 7\nprofiles = ["{tmp_path}"]\n')
    assert_serves(["--config", str(conf)], port, "tok-a")


def assert_serves(args: list[str], port: int, token: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.daemon", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/machines", headers={"Authorization": f"Bearer {token}"})
        for _ in range(200):
            try:
                with urllib.request.urlopen(req, timeout=1) as r:
                    assert r.status == 200
                    break
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"controld exited {proc.returncode}")
                time.sleep(0.1)
        else:
            raise AssertionError("controld did not serve on the config file's address")
    finally:
        terminate(proc)


def test_etcd_is_a_list_of_members_and_a_dead_one_is_passed_over(tmp_path, etcd_server):
    """In the file a TOML list (or one string), on the command line comma-separated; the first
    member here is a loopback port nobody listens on."""
    secret(tmp_path / "api", "tok-a\n")
    secret(tmp_path / "boot", "tok-b\n")
    dead, live = f"127.0.0.1:{free_port()}", f"127.0.0.1:{etcd_server.port}"
    port = free_port()
    conf = tmp_path / "controld.toml"
    conf.write_text(f'etcd = ["{dead}", "{live}"]\nregion = "list{port}"\nlisten = "127.0.0.1:{port}"\n'
                    f'api_token_file = "{tmp_path / "api"}"\nbootstrap_token_file = "{tmp_path / "boot"}"\n')
    assert_serves(["--config", str(conf)], port, "tok-a")
    port = free_port()
    assert_serves(["--config", str(conf), "--etcd", f"{dead},{live}", "--listen", f"127.0.0.1:{port}"], port, "tok-a")


def test_a_bad_config_file_is_exit_2_naming_the_key(tmp_path):
    conf = tmp_path / "controld.toml"
    for text, words in [
        ("bogus = 1\n", "bogus: unknown setting"),
        ('etcd = 2379\n', "etcd: must be a string or a list of strings"),
        ('etcd = ["127.0.0.1:2379", 2380]\n', "etcd: must be a string or a list of strings"),
        ('etcd = " , "\n', "argument --etcd: ' , ': no HOST:PORT"),
        ('etcd = ["h1:2379", "h2:x"]\n', "argument --etcd: 'h2:x' is not HOST:PORT"),
        ('heartbeat_timeout = "soon"\n', "heartbeat_timeout: must be a positive number"),
        ('maintenance_policy = "pray"\n', "maintenance_policy: must be one of move, stop"),
        ("etcd = \n", "not valid TOML"),
    ]:
        conf.write_text(text)
        r = run_controld("--config", str(conf))
        assert r.returncode == 2 and words in r.stderr, (text, r.returncode, r.stderr)


def test_token_files_are_required_from_the_file_or_the_flags(tmp_path):
    conf = tmp_path / "controld.toml"
    conf.write_text('region = "x"\n')
    r = run_controld("--config", str(conf))
    assert r.returncode == 2 and "--api-token-file: required" in r.stderr
    r = run_controld("--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_a_flag_overrides_the_file(tmp_path):
    conf = tmp_path / "controld.toml"
    conf.write_text('api_token_file = "/nonexistent/api"\nbootstrap_token_file = "/nonexistent/boot"\n')
    secret(tmp_path / "api", "")
    r = run_controld("--config", str(conf), "--api-token-file", str(tmp_path / "api"))
    # The flag's file (empty) is the one read, not the file's (missing).
    assert r.returncode == 2 and f"{tmp_path / 'api'}: no token in the file" in r.stderr, r.stderr


def test_token_files_must_be_private_and_distinct(tmp_path):
    """A token file others on the host can read is refused (as ssh refuses such a key), and so is
    a token both in the API file (admin) and in the bootstrap file (on every agent's host)."""
    api, boot = tmp_path / "api", tmp_path / "boot"
    secret(api, "tok-a\n")
    secret(boot, "tok-b\ntok-a\n")
    base = ["--etcd", "127.0.0.1:1", "--api-token-file", str(api), "--bootstrap-token-file", str(boot)]
    r = run_controld(*base)
    assert r.returncode == 2 and "--bootstrap-token-file" in r.stderr and "in --api-token-file too" in r.stderr, r.stderr
    secret(boot, "tok-b\n")
    for path, mode in ((api, 0o644), (boot, 0o640), (api, 0o602)):
        path.chmod(mode)
        r = run_controld(*base)
        assert r.returncode == 2 and f"{path}: mode {mode:04o}" in r.stderr and "chmod 600" in r.stderr, r.stderr
        path.chmod(0o600)


def test_without_a_bootstrap_token_file_it_serves(tmp_path, etcd_server):
    """--bootstrap-token-file is optional: a region whose bootstrap tokens are all made by an admin
    (they expire) runs without one; --api-token-file is required."""
    secret(tmp_path / "api", "tok-a\n")
    port = free_port()
    base = ["--etcd", f"127.0.0.1:{etcd_server.port}", "--region", f"nb{port}", "--listen", f"127.0.0.1:{port}"]
    missing = run_controld(*base)
    assert missing.returncode == 2 and "--api-token-file: required" in missing.stderr, missing.stderr
    assert_serves([*base, "--api-token-file", str(tmp_path / "api")], port, "tok-a")


def test_bootstrap_token_ttl_in_the_file_is_a_number_checked_as_the_flag_is(tmp_path):
    from controlplane.daemon import config as daemon_config
    from controlplane.daemon.main import parser

    conf = tmp_path / "controld.toml"
    for value, want in (("3600", 3600.0), ("0", 0.0), ('"90"', 90.0)):
        conf.write_text(f'api_token_file = "{tmp_path / "api"}"\nbootstrap_token_ttl = {value}\n')
        assert daemon_config.parse_args(parser(), ["--config", str(conf)]).bootstrap_token_ttl == want
    conf.write_text(f'api_token_file = "{tmp_path / "api"}"\nbootstrap_token_ttl = -5\n')
    with pytest.raises(SystemExit) as e:
        daemon_config.parse_args(parser(), ["--config", str(conf)])
    assert e.value.code == 2
