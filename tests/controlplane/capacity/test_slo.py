"""Opportunistic capacity's forecast and SLO (controlplane/capacity/slo.py), on histories made here:
the lines follow the pool's daily shape at today's level, sit below what is expected by the
errors the forecast made on the same history, say when they are estimates, and an hour is
judged against the offer made for it earliest."""

from __future__ import annotations

import random

import pytest

from controlplane.capacity import slo
from controlplane.opsplanner.maintenance import Calendar
from controlplane.store.cells import Cells

G = "generic/dc1"
DAY0 = 1_800_000_000 // 86400 * 24  # an hour at midnight UTC


def daily(hour: int) -> int:
    """Machines available in a pool of 30: guaranteed work takes 10 more from 9:00 to 17:59."""
    return 10 if 9 <= hour % 24 <= 17 else 20


def history(days: int, noise: int = 1, seed: int = 3, shape=daily) -> slo.History:
    """`days` days and 7 hours of records, from DAY0: the hour after them is 7:00."""
    rnd = random.Random(seed)
    h = slo.History()
    for t in range(DAY0, DAY0 + days * 24 + 7):
        h.put(t, {"groups": {G: {"available": shape(t) + rnd.randint(-noise, noise), "machines": 30}}})
    return h


def now(available: int, machines: int = 30) -> dict:
    return {G: {"available": available, "machines": machines}}


def test_quantile_is_the_nearest_rank_from_below_and_the_least_when_too_few():
    errors = list(range(-50, 150))  # 200 errors: the 1 % quantile is the 2nd least
    assert slo.quantile(errors, 0.99) == -49
    assert slo.quantile(errors, 0.999) == -50  # 0.2 of one error: the least
    assert slo.quantile([3, -7, 1], 0.99) == -7


def test_the_forecast_follows_the_daily_shape_and_its_lines_sit_below_by_the_errors_seen():
    h = history(10)
    hour = DAY0 + 10 * 24 + 7  # 7:00 on day 11, the hour after the history; the day before read about 20
    fc = slo.forecast(h, now(h.available(hour - 24, G)), hour)[G]
    assert [r["lead"] for r in fc] == list(range(1, 25)) and fc[0]["hour"] == (hour + 1) * 3600
    by_hour = {(r["hour"] // 3600) % 24: r for r in fc}
    assert all(r["method"] == "daily" for r in fc)
    assert 8 <= by_hour[12]["expected"] <= 12 and 18 <= by_hour[20]["expected"] <= 22  # the day's shape
    for r in fc:
        assert r["samples"] >= 100 and r["p99_measured"] and not r["p999_measured"], r
        assert r["p999"] <= r["p99"] <= r["expected"], r
        assert r["expected"] - r["p99"] <= 6, r  # noise of +-1 in three terms: errors of at most 6
    # in-sample, the quantile as defined: at most 1 % of the history's own errors fall below the 99 % line
    errs = slo.errors(h, G, 3, "daily")
    line = slo.quantile(errs, 0.99)
    assert sum(e < line for e in errs) <= 0.01 * len(errs)


def test_today_lower_than_yesterday_moves_the_whole_day_down():
    h = history(10, noise=0)
    hour = DAY0 + 10 * 24 + 7
    level = slo.forecast(h, now(20), hour)[G]
    lower = slo.forecast(h, now(15), hour)[G]  # a guaranteed entitlement grew by 5 machines since
    assert [r["expected"] for r in lower] == [r["expected"] - 5 for r in level]
    assert [r["p99"] for r in level] == [r["expected"] for r in level]  # no noise: no error seen


def test_lines_stay_within_the_pool_and_above_zero():
    h = history(6, noise=8)
    hour = DAY0 + 6 * 24 + 7
    for r in slo.forecast(h, now(20, machines=21), hour)[G]:
        assert 0 <= r["p999"] <= r["p99"] <= 21, r


def test_without_a_day_before_the_forecast_is_what_is_available_now_and_an_estimate():
    h = slo.History()
    for t in range(DAY0, DAY0 + 6):
        h.put(t, {"groups": {G: {"available": 12 + (t - DAY0) % 2, "machines": 30}}})  # 12, 13, 12, ...
    fc = slo.forecast(h, now(13), DAY0 + 6)[G]
    first = fc[0]
    assert first["method"] == "persistence" and first["expected"] == 13
    assert first["samples"] == 5 and not first["p99_measured"]  # five hour-to-hour changes: -1 the worst
    assert first["p99"] == 12
    # no history at all: expected is what is available now, no line
    bare = slo.forecast(slo.History(), now(13), DAY0)[G][0]
    assert (bare["expected"], bare["p99"], bare["p999"], bare["samples"]) == (13, None, None, 0)


def test_an_hour_is_judged_against_the_offer_made_earliest_and_misses_are_listed():
    h = slo.History()
    for t in range(DAY0, DAY0 + 4):
        h.put(t, {"groups": {G: {"available": 10, "machines": 30}}})
    h.offered[DAY0] = {G: [10, 12, 9]}  # for DAY0+1, +2, +3
    h.offered[DAY0 + 1] = {G: [11, 8]}  # for DAY0+2, +3
    rows = slo.judged(h, G)
    assert rows == [(DAY0 + 1, 10, 10, 1), (DAY0 + 2, 12, 10, 2), (DAY0 + 3, 9, 10, 3)]
    kept = slo.delivered(h)[G]
    assert (kept["judged"], kept["delivered"]) == (3, 2) and kept["ratio"] == pytest.approx(2 / 3)
    assert kept["missed"] == [{"hour": (DAY0 + 2) * 3600, "offered": 12, "available": 10, "lead": 2}]
    assert slo.delivered(slo.History(), {G})[G] == {"judged": 0, "delivered": 0, "ratio": None, "missed": []}


def test_records_round_trip():
    h = history(1)
    h.offered[DAY0] = {G: [1, 2]}
    again = slo.History()
    again.put(DAY0, h.record(DAY0))
    assert again.hours[DAY0] == h.hours[DAY0] and again.offered[DAY0] == {G: [1, 2]}
    assert slo.of_group(G) == ("generic", "dc1") and slo.group_of({"machine_type": "generic", "dc": "dc1"}) == G


def test_the_offer_is_the_99_line_less_the_failure_domain_buffer_kept_in_the_history():
    h = history(10, noise=0)
    hour = DAY0 + 10 * 24 + 7
    fc = slo.forecast(h, {G: {"available": 20, "machines": 30, "buffer": 4}}, hour)[G]
    assert all(r["buffer"] == 4 and r["offered"] == r["p99"] - 4 for r in fc), fc
    assert slo.offer({G: fc})[G] == [r["p99"] - 4 for r in fc]
    # never below zero; and without a look at the pool now, the last hour's buffer is the one kept
    h.hours[hour - 1][G]["buffer"] = 25
    for r in slo.forecast(h, {}, hour)[G]:
        assert (r["buffer"], r["offered"]) == (25, 0), r


class _Machine:
    def __init__(self, mid, entitlement, msb, machine_type="generic", healthy=True):
        self.id, self.entitlement, self.healthy = mid, entitlement, healthy
        self.labels = {"dc": "dc1", "msb": msb, "machine_type": machine_type}
        self.capacity, self.tombstones = {"cpus": 4}, ()
        self.profile_applied = None


class _Ent:
    def __init__(self, kind):
        self.kind = kind


class _State:
    def __init__(self, machines, entitlements):
        self.machines = {m.id: m for m in machines}
        self.entitlements, self.reclaims, self.maintenance = entitlements, {}, Calendar()
        self.reserve = 0
        self.cells = Cells()  # as RegionState keeps them
        for m in machines:
            self.cells.change(None, m)


def test_the_buffer_is_the_guaranteed_machines_of_the_largest_msb_of_the_group():
    """web: 2 machines in msb1, 1 in msb2; api: 2 in msb2, 1 in msb3; batch (opportunistic) 3 in msb3:
    losing msb1 takes 2 guaranteed machines, msb2 3 (web's and api's together: more than any one
    entitlement loses anywhere), msb3 1; opportunistic and down machines do not count, nor do other groups'."""
    ms = [_Machine("a", "web", "msb1"), _Machine("b", "web", "msb1"), _Machine("c", "web", "msb2"),
          _Machine("d", "api", "msb2"), _Machine("d2", "api", "msb2"), _Machine("e", "api", "msb3"),
          _Machine("f", None, "msb1"),
          _Machine("g", "web", "msb1", healthy=False), _Machine("x", "web", "msb1", machine_type="big")]
    ms += [_Machine(f"o{i}", "batch", "msb3") for i in range(3)]
    st = _State(ms, {"web": _Ent("guaranteed"), "api": _Ent("guaranteed"), "batch": _Ent("opportunistic")})
    assert slo.pool(st, 0.0)[G]["buffer"] == 3 and slo.pool(st, 0.0)["big/dc1"]["buffer"] == 1
    assert slo.pool(st, 0.0)[G]["available"] == 4  # f and batch's three: the buffer is lent, not held back
    st.reserve = 2  # the reserve is not lent: of one free machine, none is available; none of another group's
    assert slo.pool(st, 0.0)[G]["available"] == 3 and slo.pool(st, 0.0)["big/dc1"]["available"] == 0
