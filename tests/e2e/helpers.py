"""What the end-to-end tests share: an API client for a Region, job specs, Docker's view of tasks."""

from __future__ import annotations

import json
import time

from collections.abc import Iterator

from controlplane.devregion import Region
from tests.conftest import TEST_IMAGE

# Exits at once on SIGTERM, so a stop or restart takes a fraction of a second, not the grace period.
COMMAND = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.2; done"]


class Api:
    def __init__(self, region: Region):
        self.region = region

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.region.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.region.api_token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.region.tls_context()) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def ok(self, method: str, path: str, body: object = None) -> dict:
        status, answer = self.call(method, path, body)
        assert status < 300, (method, path, status, answer)
        return answer

    def job(self, handle: str) -> dict:
        return self.ok("GET", f"/v1/jobs/{handle}")

    def wait_job(self, handle: str, predicate, timeout: float = 60, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        job = None
        while time.monotonic() < deadline:
            job = self.job(handle)
            if predicate(job):
                return job
            time.sleep(0.1)
        raise AssertionError(f"{handle}: timed out waiting for {what}: {json.dumps(job)[:3000]}\n"
                             f"controld: {self.region.logs('controld')[-3000:]}")

    def wait_machines(self, predicate, timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not predicate(ms := self.ok("GET", "/v1/machines")["machines"]):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {json.dumps(ms)[:3000]}")
            time.sleep(0.1)
        return ms

    def wait_running(self, handle: str, timeout: float = 60) -> dict:
        return self.wait_job(handle, lambda j: len(j["tasks"]) >= j["count"] and all(
            t["state"] == "running" and t["spec_version"] == j["spec_version"]
            for t in j["tasks"] if t["index"] < j["count"]), timeout, "all tasks running")

    def stop(self, handle: str) -> None:
        self.ok("DELETE", f"/v1/jobs/{handle}")
        self.wait_job(handle, lambda j: j["state"] == "stopped", what="job stopped")

    def held(self, entitlement: str) -> list[str]:
        return self.ok("GET", f"/v1/entitlements/{entitlement}")["machines"]

    def machine_of(self, machine_id: str) -> dict:
        return self.ok("GET", f"/v1/machines/{machine_id}")


def job_spec(ent: str, name: str, count: int, cpus: float = 0.25, **kw) -> dict:
    return {"entitlement": ent, "name": name, "count": count,
            "task": {"image": TEST_IMAGE, "command": COMMAND, "cpus": cpus, "memory_mb": 32, **kw.pop("task", {})}, **kw}


def running_indices(region: Region, job: str) -> dict[int, list[str]]:
    """task index -> machines with a running container of it (Docker's view, not the daemon's)."""
    out: dict[int, list[str]] = {}
    for c in region.containers(job):
        if c["status"] == "running":
            out.setdefault(int(c["labels"]["twine.task-index"]), []).append(c["machine"])
    return out




def running_region(region: Region) -> Iterator[Region]:
    """A module fixture's body: start the region, hand it out, tear it down and check that the
    teardown left nothing behind (pass or fail)."""
    try:
        region.start()
        yield region
    finally:
        problems = region.stop()
        assert not problems, problems


def tidy_after(region: Region) -> Iterator[None]:
    """An autouse fixture's body for tests sharing one region: after each test (pass or fail) its
    partitions are healed, whatever it killed (etcd, controld, agents) started again and its jobs
    stopped, so their machines return to the free pool. Without it one failure fails the tests after
    it for want of machines."""
    yield
    problems = region.heal() if region.partitioned else []
    for name in ("etcd", "controld", *region.specs):
        ref = region.procs.get(region._key(name))  # noqa: SLF001 - the region's own naming of its processes
        if ref is None or not ref.alive():  # killed by the test, or died
            region.restart(name)
    api = Api(region)
    for job in api.ok("GET", "/v1/jobs")["jobs"]:
        if job["state"] != "stopped":
            api.stop(job["handle"])
    assert problems == [], problems

