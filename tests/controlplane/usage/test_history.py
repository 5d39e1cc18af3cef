"""A series' points and rollups (controlplane/usage/history.py) and their form in etcd."""

from __future__ import annotations

import pytest

from controlplane.usage import history as H

T0 = 1_800_000_000 // 3600 * 3600  # an hour's start


def test_a_minutes_point_is_the_mean_of_its_samples_and_a_minute_without_any_has_none():
    s = H.Series()
    assert s.sample(T0, 1000, 100) is None
    assert s.sample(T0 + 30, 2000, 300) is None
    assert s.sample(T0 + 180, 500, 50) == T0 // 60  # the first minute closes when the fourth begins
    assert s.close() == T0 // 60 + 3
    assert s.minutes(T0 // 60, T0 // 60 + 60) == [(T0 // 60, 1500, 200), (T0 // 60 + 3, 500, 50)]


def test_an_hours_rollup_is_mean_p95_and_max_of_its_points():
    s = H.Series()
    for i in range(60):
        s.put_minute(T0 // 60 + i, 100 * (i + 1), 1000 + i)
    assert s.close_hour(T0 // 3600) == (3050, 5700, 6000, 1030, 1056, 1059)
    assert s.hours(T0 // 3600, T0 // 3600 + 1) == [(T0 // 3600, (3050, 5700, 6000, 1030, 1056, 1059))]
    assert s.close_hour(T0 // 3600 + 1) is None and s.hours(T0 // 3600 + 1, T0 // 3600 + 2) == []


def test_the_windows_are_bounded_older_points_give_way():
    s = H.Series()
    first = T0 // 60
    for i in range(H.MINUTES + 10):  # 48 h and 10 minutes of points
        s.put_minute(first + i, i, i)
    kept = s.minutes(first, first + H.MINUTES + 10)
    assert len(kept) == H.MINUTES and kept[0] == (first + 10, 10, 10)
    s.put_minute(first, 5, 5)  # an old point never overwrites a newer one in its slot
    assert s.minutes(first, first + 1) == []
    for h in range(H.HOURS + 3):
        s.put_hour(T0 // 3600 + h, (h,) * 6)
    hours = s.hours(T0 // 3600, T0 // 3600 + H.HOURS + 3)
    assert len(hours) == H.HOURS and hours[0][0] == T0 // 3600 + 3


def test_records_round_trip_and_bad_ones_are_refused():
    s = H.Series()
    hour, day = T0 // 3600, T0 // 86400
    for i in range(0, 60, 2):
        s.put_minute(hour * 60 + i, 1000 + i, 2000 - i)
    s.close_hour(hour)
    again = H.Series()
    H.load_hour(again, hour, H.hour_record(s, hour))
    H.load_day(again, day, H.day_record(s, day))
    assert again.minutes(hour * 60, hour * 60 + 60) == s.minutes(hour * 60, hour * 60 + 60)
    assert again.hours(day * 24, day * 24 + 24) == s.hours(day * 24, day * 24 + 24)
    for bad in ({"points": "not base64!"}, {"points": H.pack([1, 2])}, {}):
        with pytest.raises((ValueError, KeyError)):
            H.load_hour(H.Series(), hour, bad)


def test_a_series_holds_what_it_has_measured_not_its_whole_window():
    """A job's history took its whole window's arrays (about 72 kB) from its first sample: a shard's
    leader of 1,200 jobs a few minutes old held 90 MB of empty slots (issue #38). Now as many as it
    holds, at most the window's."""
    s = H.Series()
    empty = s.nbytes()
    for i in range(10):
        s.put_minute(T0 // 60 + i, 1000, 100)
    assert s.nbytes() - empty < 300, s.nbytes()
    for i in range(H.MINUTES + 500):
        s.put_minute(T0 // 60 + i, i, i)
    for h in range(H.HOURS + 50):
        s.put_hour(T0 // 3600 + h, (h,) * 6)
    assert len(s.minutes(0, T0 // 60 + H.MINUTES + 500)) == H.MINUTES
    # a full window: what it holds, and what the arrays' growth leaves over (CPython's array grows
    # by a sixteenth and a few items)
    assert H.SERIES_BYTES <= s.nbytes() - empty <= H.SERIES_BYTES * 1.08, (s.nbytes(), H.SERIES_BYTES)


def test_points_in_any_order_read_as_the_window_of_the_newest():
    """Records load in any order (etcd's, a leader's new series); a minute given twice keeps the
    later point; one older than the window of the newest point held is left out. Checked against a
    dict of every point, on random minutes."""
    import random

    rng = random.Random(38)
    for _ in range(20):
        s, ref = H.Series(), {}
        base = T0 // 60
        for _ in range(rng.choice((5, 300, 4000))):
            minute = base + rng.randrange(0, 3 * H.MINUTES) if rng.random() < 0.3 else \
                base + rng.randrange(0, H.MINUTES // 4)
            c, m = rng.randrange(10_000), rng.randrange(10_000)
            s.put_minute(minute, c, m)
            newest = max(ref, default=minute)
            if minute > newest - H.MINUTES:
                ref[minute] = (c, m)
            newest = max(ref)
            ref = {k: v for k, v in ref.items() if k > newest - H.MINUTES}
        end = max(ref) + 1
        assert s.minutes(0, end) == [(k, *ref[k]) for k in sorted(ref)]
        assert s.latest_minute() == max(ref)
        lo = rng.randrange(base, end)
        assert s.minutes(lo, lo + 90) == [(k, *ref[k]) for k in sorted(ref) if lo <= k < lo + 90 and k >= lo + 90 - H.MINUTES]
    assert H.Series().latest_minute() == H.NONE and H.Series().minutes(0, 10**9) == []
    s = H.Series()
    for h in (T0 // 3600 + 5, T0 // 3600, T0 // 3600 + 2, T0 // 3600):
        s.put_hour(h, (h % 7,) * 6)
    assert [h for h, _ in s.hours(0, T0 // 3600 + 6)] == [T0 // 3600, T0 // 3600 + 2, T0 // 3600 + 5]
    assert s.hours(T0 // 3600 + 2, T0 // 3600 + 3) == [(T0 // 3600 + 2, ((T0 // 3600 + 2) % 7,) * 6)]


def test_the_history_bytes_metric_says_what_the_series_hold():
    """twine_usage_history_bytes was the series' count times their fixed size; now what they hold:
    it grows with the points recorded, and a day of minutes costs about a day's share of the
    window."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from controlplane.store.keys import Keys
    from controlplane.store.state import RegionState
    from controlplane.usage.book import UsageBook
    from controlplane.usage.metrics import UsageCollector
    from controlplane.usage.region import RegionUsage

    series = {("job", f"e/j{i}"): H.Series() for i in range(3)}
    registry = CollectorRegistry()
    registry.register(UsageCollector(RegionState(None, Keys("hb")), RegionUsage(UsageBook()),
                                     SimpleNamespace(series=series, counters={})))

    def held() -> float:
        return registry.get_sample_value("twine_usage_history_bytes")

    empty = held()
    assert empty < 3 * 500, empty
    for i in range(H.MINUTES // 2):  # a day of minutes in one series
        series[("job", "e/j0")].put_minute(T0 // 60 + i, 100, 100)
    day = 3 * 4 * H.MINUTES // 2  # its three figures a minute, int32 each
    assert day <= held() - empty <= day * 1.08, (held(), empty, day)
    assert held() == sum(s.nbytes() for s in series.values())
