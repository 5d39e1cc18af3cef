"""The fuzz check's one allowance (tests/controlplane/fuzz_hooks.py): a refused request's window
that saw etcd move passes only when every key written is the hourly recorders' history and an hour
began at most HOURLY_WINDOW seconds before; anything else, a delete (nothing to show) included,
fails. The keys are the recorders' own (UsageKeys, CapacityRecorder.key), not copies of them."""

from __future__ import annotations

from types import SimpleNamespace

from controlplane.capacity.recorder import CapacityRecorder
from controlplane.store.keys import Keys
from controlplane.usage.recorder import UsageKeys
from tests.controlplane.fuzz_hooks import HOURLY_WINDOW, hourly_history

HOUR = 493_000 * 3600.0  # an hour's start, epoch seconds


def recorders_keys() -> list[str]:
    keys = UsageKeys("region1")
    capacity = CapacityRecorder(SimpleNamespace(keys=Keys("region1")), store=None, leads_shard0=lambda: True)
    return [keys.minutes(("job", "web/api"), 492_999), keys.hours(("entitlement", "web"), 20_541),
            keys.series(("job", "web/api")), capacity.key(492_999)]


def test_the_hourly_records_just_after_an_hour_began_are_told_apart():
    for key in recorders_keys():
        assert hourly_history([key], HOUR + 5)
        assert hourly_history([key], HOUR + HOURLY_WINDOW)
    assert hourly_history(recorders_keys(), HOUR + 61)


def test_anything_else_fails_the_check():
    hourly = recorders_keys()
    assert not hourly_history(hourly, HOUR + HOURLY_WINDOW + 1), "too long after the hour began"
    assert not hourly_history(hourly, HOUR - 1), "before the hour's end"
    assert not hourly_history([], HOUR + 5), "a move with no key to show (a delete)"
    region = Keys("region1")
    for other in (region.job("web/api"), region.machine("m1"), UsageKeys("region1").srm("web/api"),
                  "/twine-usage/region1/minutesx/1"):
        assert not hourly_history([other], HOUR + 5), other
        assert not hourly_history([*hourly, other], HOUR + 5), other
