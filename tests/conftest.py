"""Shared fixtures. Tests touch the real kernel and real Docker; every change is restored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

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


def missing_part(part: str) -> NoReturn:
    """A test whose real part is missing here (a kind of interrupt, a kernel feature): skipped on
    a developer's machine, failed under CI=true with the part named (CI never passes a test by
    skipping it). Call it only after the host is restored, or from a test whose fixtures restore it."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing real part (CI=true fails, it does not skip): {part}")
    pytest.skip(part)


TEST_IMAGE = "twine/busybox:1"


@pytest.fixture(scope="session")
def docker_client():
    """The real Docker daemon, with the local test image built. Without dockerd: a skip on a
    developer's machine, a failure under CI=true (a test whose real part is missing never passes
    as skipped there)."""
    import subprocess

    import docker

    try:
        client = docker.from_env(version="auto")
        client.ping()
    except Exception as e:  # noqa: BLE001
        if os.environ.get("CI") == "true":
            pytest.fail(f"docker is not running (CI=true: the Docker tests fail, they do not skip): {e}")
        pytest.skip(f"docker is not running: {e}")
    subprocess.run([str(Path(__file__).parents[1] / "scripts" / "build-images.sh")], check=True)
    sweep_stale_test_containers(client)
    return client


STALE_AFTER = 3600.0  # seconds: no test runs this long, so a test machine's container older than this was left


def sweep_stale_test_containers(client, older_than: float = STALE_AFTER, prefix: str = "test") -> list[str]:
    """Remove the containers of test machines (`machine_id`: "test" + hex) that a run killed with
    its host (no fixture teardown ran) left behind; a run going on beside this one has none this old."""
    import time
    from datetime import datetime

    removed = []
    for c in client.containers.list(all=True, filters={"label": "twine.machine"}, ignore_removed=True):
        created = datetime.fromisoformat(c.attrs["Created"][:26].rstrip("Z") + "+00:00").timestamp()
        if c.labels.get("twine.machine", "").startswith(prefix) and time.time() - created > older_than:
            c.remove(force=True)
            removed.append(c.name)
    return removed


@pytest.fixture
def machine_id(docker_client):
    """A machine id of this test's own; every container labelled with it is removed afterwards."""
    import uuid

    mid = "test" + uuid.uuid4().hex[:20]
    yield mid
    for c in docker_client.containers.list(all=True, filters={"label": f"twine.machine={mid}"}, ignore_removed=True):
        c.remove(force=True)


def _etcd():
    import shutil

    from tests.etcd_server import EtcdServer

    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed: run scripts/setup.sh (Debian's etcd-server)")
    server = EtcdServer().start()
    return server


@pytest.fixture(scope="session")
def etcd_server():
    """One real etcd for the session, on free loopback ports; stopped and its data removed after."""
    server = _etcd()
    yield server
    server.stop()


@pytest.fixture
def own_etcd():
    """An etcd of the test's own, for a test that stops and starts it (an outage)."""
    server = _etcd()
    yield server
    server.stop()


# -- the VM region (tests/vm): booted in the background while the other tests run -------------

BRINGUP = pytest.StashKey()


def _vm_items(items) -> list:
    return [i for i in items if i.get_closest_marker("vm") is not None]


def pytest_collection_modifyitems(config, items):
    """VM tests last, so that their region has the whole run of the others to boot; of them, the
    control plane's failover last: it grows the region to three control hosts (etcd and controld on
    the machine VMs as well, which would starve the others' tasks under emulation) and leaves its
    etcd with other members. It runs only when asked for (TWINE_VM_HA=1, or a region of the HA
    shape, TWINE_VM_CONTROL=3): in the default run it took the suite past its 40 minutes on a
    2-core host, and its writes through m1's controld were not yet accepted there (issue #35)."""
    vm = _vm_items(items)
    if vm:
        from tests.vm.region import CONTROL

        ha = [i for i in vm if i.nodeid.startswith("tests/vm/test_ha.py")]
        if ha and len(CONTROL) < 3 and os.environ.get("TWINE_VM_HA") != "1":
            config.hook.pytest_deselected(items=ha)
            vm = [i for i in vm if i not in ha]
        vm.sort(key=lambda i: i in ha)  # stable: the rest keep their order
        items[:] = [i for i in items if i.get_closest_marker("vm") is None] + vm


def pytest_sessionstart(session):
    """What an earlier test run killed before its teardown left (its regions' namespaces and task
    containers) is removed first: a teardown that never ran cannot clean up, the next run does."""
    if os.geteuid() != 0:
        return
    from controlplane.devregion.region import sweep_orphans

    for what in sweep_orphans():
        print(f"removed, left by a run killed before its teardown: {what}")


def pytest_collection_finish(session):
    import os

    from tests.vm.region import Bringup, missing_tools

    if not _vm_items(session.items) or missing_tools() or session.config.option.collectonly:
        return  # nothing to boot (the region fixture reports missing tools)
    keep = os.environ.get("TWINE_VM_KEEP") == "1" and os.environ.get("CI") != "true"
    session.config.stash[BRINGUP] = Bringup(keep)


def pytest_sessionfinish(session):
    bringup = session.config.stash.get(BRINGUP, None)
    if bringup is not None:
        bringup.finish()


def pytest_terminal_summary(terminalreporter, config):
    bringup = config.stash.get(BRINGUP, None)
    if bringup is not None:
        t = bringup.region.timings
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in t.items())
        terminalreporter.write_line(f"VM region: {parts or 'used as it was'} (vagrant/.region/vm.log)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text (prometheus_client's parser) -> {sample: value}; a sample with labels is
    keyed name{label="value",...} with its labels sorted."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
