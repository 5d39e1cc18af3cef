"""Schemathesis hooks for test_api_fuzz.py (loaded through SCHEMATHESIS_HOOKS): an etcd snapshot
around every request, and a check that a refused request (4xx) wrote nothing.

The store's revision is read from etcd's JSON gateway (TWINE_FUZZ_ETCD: the test's etcd on
loopback) before each call and after its answer; the daemon's own background work writes nothing
while the region has no agents and a heartbeat timeout of an hour."""

from __future__ import annotations

import base64
import json
import os
import urllib.request

import schemathesis

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_before: dict[int, int] = {}


def revision() -> int:
    req = urllib.request.Request(os.environ["TWINE_FUZZ_ETCD"] + "/v3/kv/range", method="POST",
                                 data=json.dumps({"key": base64.b64encode(b"/").decode()}).encode())
    with _OPENER.open(req, timeout=10) as r:
        return int(json.loads(r.read())["header"]["revision"])


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    # a job's controller is resolved by controld (taskcontrol/reach.py): a made-up host name would
    # be a DNS query off this machine, so the fuzzed jobs name an address, never a name
    if isinstance(case.body, dict) and isinstance(case.body.get("controller"), str):
        case.body["controller"] = "http://127.0.0.1:9/"
    # so is an autoscale metric's URL, which the SRM reads (srm/load.py)
    auto = case.body.get("autoscale") if isinstance(case.body, dict) else None
    metric = auto.get("metric") if isinstance(auto, dict) else None
    if isinstance(metric, dict) and isinstance(metric.get("http"), str):
        metric["http"] = "http://127.0.0.1:9/load"
    _before[id(case)] = revision()


@schemathesis.check
def refused_writes_nothing(ctx, response, case):
    """A request answered 4xx leaves etcd as it was."""
    before = _before.pop(id(case), None)
    if before is None or not 400 <= response.status_code < 500:
        return None
    after = revision()
    with open(os.environ["TWINE_FUZZ_LOG"], "a") as log:  # the test counts the refusals looked at
        log.write(f"{response.status_code} {case.method} {case.path} {before} {after}\n")
    if after != before:
        raise AssertionError(f"{case.method} {case.formatted_path} was refused ({response.status_code}) but etcd "
                             f"moved from revision {before} to {after}")
    return None
