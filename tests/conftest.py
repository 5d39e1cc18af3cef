"""Shared fixtures. Tests touch the real kernel and real Docker; every change is restored."""

from __future__ import annotations

from pathlib import Path

import pytest


class HostFiles:
    """Remembers kernel files (sysctls, /proc/irq/*, hugepage counts) and writes them back."""

    def __init__(self) -> None:
        self.saved: list[tuple[Path, str]] = []

    def save(self, *paths: str | Path) -> None:
        for p in map(Path, paths):
            self.saved.append((p, p.read_text()))

    def restore(self) -> list[str]:
        errors = []
        for path, text in reversed(self.saved):
            value = " ".join(text.split())
            try:
                if path.read_text().split() != text.split():
                    path.write_text(value)
            except OSError as e:
                errors.append(f"{path}: {e}")
        return errors


@pytest.fixture
def host_files():
    """`host_files.save(path, ...)` before changing a kernel file; it is restored after the test,
    pass or fail."""
    h = HostFiles()
    yield h
    errors = h.restore()
    assert not errors, f"could not restore host state: {errors}"


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


TEST_IMAGE = "twine/busybox:1"


@pytest.fixture(scope="session")
def docker_client():
    """The real Docker daemon, with the local test image built. Skips only if dockerd is absent."""
    import subprocess

    import docker

    try:
        client = docker.from_env(version="auto")
        client.ping()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"docker is not running: {e}")
    subprocess.run([str(Path(__file__).parents[1] / "scripts" / "build-images.sh")], check=True)
    return client


@pytest.fixture
def machine_id(docker_client):
    """A machine id of this test's own; every container labelled with it is removed afterwards."""
    import uuid

    mid = "test" + uuid.uuid4().hex[:20]
    yield mid
    for c in docker_client.containers.list(all=True, filters={"label": f"twine.machine={mid}"}):
        c.remove(force=True)


@pytest.fixture(scope="session")
def etcd_server():
    """One real etcd for the session, on free loopback ports; stopped and its data removed after."""
    import shutil

    from tests.etcd_server import EtcdServer

    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed: run scripts/setup.sh (Debian's etcd-server)")
    server = EtcdServer().start()
    yield server
    server.stop()
