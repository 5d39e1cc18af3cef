"""The fleet's Prometheus families (usage/metrics.py): summed by dc, machine type and entitlement
from copies of the cells taken when collected, in the thread that writes a scrape's text (issue
#38: at 1,000,000 machines those sums were most of a scrape's time on the event loop)."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest

from controlplane.store.cells import MACHINES, RESERVED_CPU_M, RESERVED_MB
from controlplane.usage.metrics import _Fleet, _Lazy
from tests.controlplane.daemon.test_metrics import scrape_on_a_loop


def row(machines: int, cpu_m: int, mb: int) -> list[int]:
    r = [0] * 7
    r[MACHINES], r[RESERVED_CPU_M], r[RESERVED_MB] = machines, cpu_m, mb
    return r


def test_the_sums_are_by_dc_type_and_entitlement_over_every_replica_and_made_when_first_read():
    rows = {("dc1", "msb1", "web", "h", "big"): row(2, 3000, 1024), ("dc1", "msb2", "web", "h", "big"): row(1, 500, 0),
            ("dc2", "msb3", "", "h", "big"): row(4, 0, 0)}
    mine = {("dc1", "msb1", "web", "h", "big"): [1500, 300, 0, 0, 0, 0, 0]}
    theirs = {("dc1", "msb2", "web", "h", "big"): [500, 100, 0, 0, 0, 0, 0]}
    fleet = _Fleet(rows, {("big", "dc2"): (4, 0)}, [dict(mine), dict(theirs)])
    families = [_Lazy("m", "machines", ["dc", "machine_type", "entitlement"], fleet, "n"),
                _Lazy("u", "used", ["dc", "machine_type", "entitlement"], fleet, "cu"),
                _Lazy("r", "reserved", ["dc", "machine_type", "entitlement"], fleet, "cr"),
                _Lazy("p", "pool", ["dc", "machine_type"], fleet, "pool")]
    del rows[("dc1", "msb2", "web", "h", "big")]  # after the collect: its copy has the cell still
    mine[("dc1", "msb1", "web", "h", "big")][0] += 500  # a heartbeat's figure, in place: read as it is
    assert fleet._sums is None  # nothing summed until a family's samples are read
    got = {f.name: {tuple(s.labels.values()): s.value for s in f.samples} for f in families}
    assert got == {"m": {("dc1", "big", "web"): 3, ("dc2", "big", ""): 4},
                   "u": {("dc1", "big", "web"): 2.5}, "r": {("dc1", "big", "web"): 3.5, ("dc2", "big", ""): 0.0},
                   "p": {("dc2", "big"): 4}}


def test_a_scrape_sums_the_fleet_in_its_writing_thread(monkeypatch):
    ran: dict[str, int] = {}
    sums = _Fleet.sums

    def noting(self):  # the real sums, its thread noted
        ran.setdefault("sums", threading.get_ident())
        return sums(self)

    monkeypatch.setattr(_Fleet, "sums", noting)

    class Collector:
        def collect(self):
            fleet = _Fleet({("dc1", "msb1", "web", "h", "big"): row(2, 1000, 0)}, {}, [])
            yield _Lazy("twine_test_fleet_machines", "machines", ["dc", "machine_type", "entitlement"], fleet, "n")

    text, registry = scrape_on_a_loop(Collector(), ran)
    assert ran["sums"] != ran["loop"]
    assert b'twine_test_fleet_machines{dc="dc1",entitlement="web",machine_type="big"} 2.0' in text
    assert text == generate_latest(registry)
