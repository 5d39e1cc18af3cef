"""The test session's sweep of containers a killed run left (its host restarted mid-test, so no
fixture teardown ran): real Docker, containers of a machine id of this test's own."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import TEST_IMAGE, sweep_stale_test_containers

pytestmark = pytest.mark.docker


def test_containers_of_test_machines_older_than_the_limit_are_removed_and_others_kept(docker_client):
    mid = "test" + uuid.uuid4().hex[:20]
    left = docker_client.containers.create(TEST_IMAGE, ["true"], labels={"twine.machine": mid})
    other = docker_client.containers.create(TEST_IMAGE, ["true"], labels={"twine.machine": "kept" + mid})
    try:
        assert sweep_stale_test_containers(docker_client, older_than=3600, prefix=mid) == []  # seconds old: kept
        time.sleep(1.5)
        assert sweep_stale_test_containers(docker_client, older_than=1, prefix=mid) == [left.name]
        ids = {c.id for c in docker_client.containers.list(all=True, filters={"label": "twine.machine"})}
        assert left.id not in ids and other.id in ids
    finally:
        for c in (left, other):
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - removed by the sweep already
                pass
