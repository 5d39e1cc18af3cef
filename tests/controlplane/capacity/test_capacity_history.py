"""The pool's history (controlplane/capacity/recorder.py) against real etcd, on a clock of the
test's: each hour's least available machines and the lines offered after it are kept, a new
leader of shard 0 reads what its predecessor kept and judges the hours by it; and the API and
twinectl answer from it on a real twine-controld."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from prometheus_client import CollectorRegistry, generate_latest

from controlplane.capacity import slo
from controlplane.capacity.metrics import CapacityCollector
from controlplane.capacity.recorder import CapacityRecorder
from controlplane.store import Store
from controlplane.store.keys import Keys
from controlplane.store.records import EntitlementRec, MachineRec
from controlplane.store.state import RegionState
from tests.controlplane.controld_proc import API_TOKEN, daemon_with_sim_agents

T0 = 1_800_000_000 // 86400 * 86400  # midnight
HOUR = T0 // 3600
G = "generic/dc1"


def machine(mid: str, entitlement: str | None, msb: str = "msb1") -> MachineRec:
    return MachineRec(mid, mid, {"dc": "dc1", "msb": msb, "rack": "r1", "machine_type": "generic"},
                      {"cpus": 4, "memory_mb": 4096}, entitlement)


async def leader(port: int, region: str) -> tuple[Store, RegionState, CapacityRecorder]:
    store = Store([("127.0.0.1", port)])
    state = RegionState(store, Keys(region))
    await state.start()
    return store, state, CapacityRecorder(state, store, lambda: True)


def test_each_hour_keeps_its_least_available_and_the_next_leader_judges_the_offers(etcd_server):
    region = "r" + uuid.uuid4().hex[:8]

    async def main():
        store, state, rec = await leader(etcd_server.port, region)
        keys = Keys(region)
        rev = await store.commit([], {  # (its Revision: the view waits for all of its events)
            keys.entitlement("web"): EntitlementRec("web", "generic", 3).to_json(),
            keys.entitlement("batch"): dataclasses.replace(EntitlementRec("batch", "generic", 3),
                                                           kind="opportunistic").to_json(),
            keys.machine("m1"): machine("m1", "web").to_json(),
            keys.machine("m2"): machine("m2", "batch").to_json(),
            keys.machine("m3"): machine("m3", None, "msb2").to_json(),
            keys.machine("m4"): machine("m4", None, "msb2").to_json()})
        await state.wait_for(rev)
        assert slo.pool(state, T0)[G] == {"machines": 4, "guaranteed": 1, "opportunistic": 1, "free": 2,
                                          "reclaiming": 0, "available": 3, "buffer": 1}
        await rec.tick(T0 + 10)
        # half an hour in, web takes a free machine of the other MSB (its buffer stays one machine: losing
        # either MSB loses one of web's); an hour on, the hour's record says the least
        await state.wait_for(await store.commit([], {keys.machine("m3"): machine("m3", "web", "msb2").to_json()}))
        await rec.tick(T0 + 1800)
        old = rec.key(HOUR - slo.HOURS_KEPT)  # a record of 8 weeks before: gone when the hour is kept
        await store.commit([], {old: {"groups": {G: {"available": 9, "machines": 9}}, "offered": {}}})
        await rec.tick(T0 + 3610)
        [kept] = (await store.range(rec.prefix))[0]
        assert kept.key == rec.key(HOUR)
        assert kept.value["groups"][G]["available"] == 2 and kept.value["groups"][G]["guaranteed"] == 2
        assert kept.value["groups"][G]["buffer"] == 1
        assert kept.value["offered"] == {G: [None] * slo.LEADS}  # one hour: no error seen to draw a line from

        # a day and more of hours: lines are offered, and hours judged against them
        for h in range(2, 30):
            await rec.tick(T0 + h * 3600 + 10)
        assert rec.counters["hours_written"] == 29
        assert rec.offered_now[G] == 1 and rec.kept[G]["judged"] > 0  # 2 available all along, less the buffer
        assert rec.kept[G]["delivered"] == rec.kept[G]["judged"]  # nothing changed since: every offer kept
        registry = CollectorRegistry()
        registry.register(CapacityCollector(rec))
        text = generate_latest(registry).decode()
        for line in (f'twine_capacity_available_machines{{group="{G}"}} 2.0',
                     f'twine_capacity_buffer_machines{{group="{G}"}} 1.0',
                     f'twine_capacity_offered_machines{{group="{G}"}} 1.0',
                     f'twine_capacity_slo_hours_judged{{group="{G}"}} {rec.kept[G]["judged"]}.0'):
            assert line in text, text

        # another leader (or a restart): it reads the same from etcd before its first hour ends
        _, _, rec2 = await leader(etcd_server.port, region)
        await rec2.tick(T0 + 29 * 3600 + 600)
        assert (rec2.kept, rec2.offered_now) == (rec.kept, rec.offered_now)
        assert rec2.counters["hours_written"] == 0
        # not leading shard 0 any more: nothing of it is exported
        rec2.leads = lambda: False
        await rec2.tick(T0 + 29 * 3600 + 610)
        assert rec2.hour is None
        registry = CollectorRegistry()
        registry.register(CapacityCollector(rec2))
        assert "twine_capacity" not in generate_latest(registry).decode()

    asyncio.run(main())


def test_the_forecast_and_the_slo_through_the_api_and_twinectl(tmp_path, etcd_server, capsys):
    from controlplane.cli import twinectl

    # (its own recorder's first look at the pool is a minute on, past this test: the history is the
    # one seeded here)
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2", "h3"), heartbeat_timeout=5.0) as (c, _):
        def ctl(*argv):
            return twinectl.main(["--url", c.url, "--token", API_TOKEN, *argv])

        assert c.call("POST", "/v1/entitlements", {"name": "batch", "machine_type": "generic", "quota": 3,
                                                   "kind": "opportunistic"})[0] == 201
        status, body = c.call("GET", "/v1/capacity/forecast")
        assert status == 200, body
        group = next(g for g in body["groups"] if g["now"]["machines"])
        assert group["now"]["available"] == group["now"]["machines"] == 3  # all free
        assert [h["lead"] for h in group["hours"]] == list(range(1, 25))
        assert group["hours"][0]["p99"] is None and group["hours"][0]["expected"] == 3  # no history yet
        assert c.call("GET", "/v1/capacity/forecast?entitlement=nope")[0] == 404

        # three days of a pool that loses two machines every afternoon, as a leader would have kept
        # them (at this hour of the day and the next all three were available, as now: today's level is
        # the day before's, should the next hour begin before the forecast is asked for)
        name = group["group"]
        now_hour = int(time.time() // 3600)
        prefix = f"/twine-usage/{c.region}/capacity/"

        def hist(t: int) -> int:
            return 1 if 12 <= t % 24 <= 17 and (t - now_hour) % 24 not in (0, 1) else 3

        async def seed():
            store = Store([("127.0.0.1", etcd_server.port)])
            puts = {}
            for t in range(now_hour - 72, now_hour):
                puts[f"{prefix}{t:08d}"] = {"groups": {name: {"available": hist(t), "machines": 3}},
                                            "offered": {name: [2] * 24}}
            for i in range(0, len(puts), 64):
                await store.commit([], dict(list(puts.items())[i:i + 64]))
            await store.close()

        asyncio.run(seed())
        body = c.call("GET", "/v1/capacity/forecast?entitlement=batch")[1]
        [g] = [g for g in body["groups"] if g["group"] == name]
        assert body["history_hours"] == 72
        for h in g["hours"]:  # the afternoons' dip, at today's level; lines from a history the forecast met
            at = h["hour"] // 3600
            assert (h["expected"], h["p99"]) == ((hist(at - 24), hist(at - 24)) if h["lead"] < 24 else (3, 3)), h
            assert (h["buffer"], h["offered"]) == (0, h["p99"]), "no guaranteed machine: no buffer to keep"
        slo_body = c.call("GET", "/v1/capacity/slo")[1]
        [kept] = [k for k in slo_body["groups"] if k["group"] == name]
        seeded = range(now_hour - 72, now_hour)
        assert kept["judged"] == 71  # every hour but the first has an offer made before it
        assert kept["judged"] - kept["delivered"] == sum(1 for t in seeded[1:] if hist(t) < 2), kept
        assert kept["missed"] and all(m["offered"] == 2 and m["available"] == 1 for m in kept["missed"])

        assert ctl("capacity", "forecast", "--entitlement", "batch") == 0
        out = capsys.readouterr().out
        assert f"{name}: 3 of 3 machine(s) available now" in out and "EXPECTED" in out and "OFFERED" in out, out
        assert "failure-domain buffer: 0" in out, out
        assert ctl("capacity", "slo") == 0
        out = capsys.readouterr().out
        assert "HOURS JUDGED" in out and f"missed {name}" in out and "reclaims: none" in out, out
