"""Schemathesis hooks for test_api_fuzz.py (loaded through SCHEMATHESIS_HOOKS): an etcd snapshot
around every request, and a check that a refused request (4xx) wrote nothing.

The store's revision is read from etcd's JSON gateway (TWINE_FUZZ_ETCD: the test's etcd on
loopback) before each call and after its answer; the daemon's own background work writes nothing
while the region has no agents and a heartbeat timeout of an hour, but for one thing no flag puts
off: at each hour's end the leaders' recorders keep the hour's usage and capacity history in etcd
(usage/recorder.py, capacity/recorder.py), at their first look after it (each looks at least once
a minute). A run that spans an hour's end sees that write: the revision moved, every revision between
is the last write of such a record, within HOURLY_WINDOW seconds after the hour. Only that is told apart (and logged as
such); any other write, or a move with no key to show for it (a delete), fails the check.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.request

import schemathesis

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_before: dict[int, int] = {}
# the keys the hourly recorders write at an hour's end: usage minutes, hourly rollups and series
# markers (usage/recorder.py), the pool's hour (capacity/recorder.py)
HOURLY = re.compile(r"^/twine-usage/[^/]+/(minutes|hours|series|capacity)/")
HOURLY_WINDOW = 180.0  # the recorders' looks are a minute apart at most: three, on a loaded host


def _range(body: dict) -> dict:
    req = urllib.request.Request(os.environ["TWINE_FUZZ_ETCD"] + "/v3/kv/range", method="POST",
                                 data=json.dumps(body).encode())
    with _OPENER.open(req, timeout=10) as r:
        return json.loads(r.read())


def revision() -> int:
    return int(_range({"key": base64.b64encode(b"/").decode()})["header"]["revision"])


def written_since(rev: int) -> dict[str, int]:
    """The keys whose last write came after `rev`, with that write's revision (a key deleted since
    is not among them)."""
    every = {"key": base64.b64encode(b"\0").decode(), "range_end": base64.b64encode(b"\0").decode(),
             "keys_only": True, "min_mod_revision": str(rev + 1)}
    return {base64.b64decode(kv["key"]).decode(errors="replace"): int(kv["mod_revision"])
            for kv in _range(every).get("kvs", [])}


def hourly_history(written: dict[str, int], before: int, after: int, now: float) -> bool:
    """Whether etcd's move from revision `before` to `after` was the hourly recorders' work at an
    hour's end: every revision between is the last write of a key written (a revision none shows
    was a delete, or a key written again), all of those keys are their records, and `now` (epoch
    seconds) is within HOURLY_WINDOW after an hour began."""
    mine = {k: r for k, r in written.items() if r <= after}  # (later writes are the next request's)
    return after > before and now % 3600 <= HOURLY_WINDOW and set(mine.values()) == set(range(before + 1, after + 1)) \
        and all(HOURLY.match(k) for k in mine)


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
    written = written_since(before) if after != before else {}
    hourly = hourly_history(written, before, after, time.time())
    with open(os.environ["TWINE_FUZZ_LOG"], "a") as log:  # the test counts the refusals looked at
        log.write(f"{response.status_code} {case.method} {case.path} {before} {after}"
                  f"{' hourly ' + ','.join(written) if hourly else ''}\n")
    if after != before and not hourly:
        raise AssertionError(f"{case.method} {case.formatted_path} was refused ({response.status_code}) but etcd "
                             f"moved from revision {before} to {after}: written {written}")
    return None
