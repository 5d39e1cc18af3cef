"""The fuzz check's one allowance (tests/controlplane/fuzz_hooks.py): a refused request's window
that saw etcd move passes only when every revision in it is the last write of one of the hourly
recorders' history keys and an hour began at most HOURLY_WINDOW seconds before; anything else, a
delete (a revision no key shows) included, fails. The keys are the recorders' own (UsageKeys, CapacityRecorder.key), not copies of them."""

from __future__ import annotations

from types import SimpleNamespace

from controlplane.capacity.recorder import CapacityRecorder
from controlplane.store.keys import Keys
from controlplane.usage.recorder import UsageKeys
from tests.controlplane.fuzz_hooks import HOURLY_WINDOW, hourly_history

HOUR = 493_000 * 3600.0  # an hour's start, epoch seconds


BEFORE = 100  # the revision before the request


def recorders_keys() -> dict[str, int]:
    """The recorders' hour-end keys, written one a revision after BEFORE."""
    keys = UsageKeys("region1")
    capacity = CapacityRecorder(SimpleNamespace(keys=Keys("region1")), store=None, leads_shard0=lambda: True)
    written = [keys.minutes(("job", "web/api"), 492_999), keys.hours(("entitlement", "web"), 20_541),
               keys.series(("job", "web/api")), capacity.key(492_999)]
    return {k: BEFORE + 1 + i for i, k in enumerate(written)}


def test_the_hourly_records_just_after_an_hour_began_are_told_apart():
    for key in recorders_keys():
        assert hourly_history({key: BEFORE + 1}, BEFORE, BEFORE + 1, HOUR + 5)
        assert hourly_history({key: BEFORE + 1}, BEFORE, BEFORE + 1, HOUR + HOURLY_WINDOW)
    hourly = recorders_keys()
    assert hourly_history(hourly, BEFORE, BEFORE + len(hourly), HOUR + 61)
    # a write after the request's answer (its `after`) is the next request's to account for
    assert hourly_history({**hourly, "/twine/region1/jobs/web/api": BEFORE + 9}, BEFORE, BEFORE + len(hourly), HOUR + 61)


def test_anything_else_fails_the_check():
    hourly = recorders_keys()
    after = BEFORE + len(hourly)
    assert not hourly_history(hourly, BEFORE, after, HOUR + HOURLY_WINDOW + 1), "too long after the hour began"
    assert not hourly_history(hourly, BEFORE, after, HOUR - 1), "before the hour's end"
    assert not hourly_history({}, BEFORE, BEFORE + 1, HOUR + 5), "a move with no key to show (a delete)"
    assert not hourly_history(hourly, BEFORE, after + 1, HOUR + 5), "a revision no key shows: a delete beside them"
    region = Keys("region1")
    for other in (region.job("web/api"), region.machine("m1"), UsageKeys("region1").srm("web/api"),
                  "/twine-usage/region1/minutesx/1"):
        assert not hourly_history({other: BEFORE + 1}, BEFORE, BEFORE + 1, HOUR + 5), other
        assert not hourly_history({**hourly, other: after + 1}, BEFORE, after + 1, HOUR + 5), other
