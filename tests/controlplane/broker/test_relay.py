"""Where a replica relays the heartbeats it takes (controlplane/broker/relay.py), with the real
Coordinator's view of the members (not running: its lease's validity set by the test)."""

from __future__ import annotations

import time

from controlplane.broker.relay import Relay
from controlplane.coordination.coordinator import Coordinator, rendezvous
from controlplane.store.codec import encode
from controlplane.store.keys import Keys
from controlplane.store.state import RegionState


async def _nothing(*_args) -> None:
    return None


def test_while_its_lease_is_in_doubt_a_replica_relays_its_own_machines_heartbeats_to_their_stand_in():
    """b is cut off from etcd: its lease lapses, a and c take its machines over, but its watch is
    stalled and still shows it a member, and agents still reach it. Their heartbeats must reach
    the member that judges them now, or it fails them while they heartbeat: b relayed nothing (it
    took itself for their owner). A machine of another member's is relayed to it as ever; with
    the lease valid, b keeps its own."""
    keys = Keys("relay")
    state = RegionState(None, keys)
    for rev, mid in enumerate(("a", "b", "c"), 1):
        state._take(keys.member(mid), encode({"id": mid, "url": f"http://{mid}", "roles": ["health"]}), rev)  # noqa: SLF001
    coord = Coordinator(None, keys, state, "http://b", ("health",), (), _nothing, _nothing, ttl=2, member_id="b")
    relay = Relay(state, None, None, coord, lambda: None, "token")
    machines = [f"m{i:03d}" for i in range(60)]
    ours = [mid for mid in machines if rendezvous(("a", "b", "c"), mid) == "b"]
    theirs = [mid for mid in machines if mid not in ours]
    assert ours and theirs

    coord.lease, coord.valid_until = 7, time.monotonic() + 60  # a member, its lease valid
    for mid in machines:
        relay.heard(mid)
    relayed = {mid for got in relay.seen.values() for mid in got}
    assert relayed == set(theirs), "with its lease valid, b judges its own"
    assert all(rendezvous(("a", "b", "c"), mid) == member for member, got in relay.seen.items() for mid in got)

    relay.seen.clear()
    coord.valid_until = time.monotonic()  # no keep-alive answered: the lease is in doubt
    for mid in machines:
        relay.heard(mid)
    assert {mid for got in relay.seen.values() for mid in got} == set(machines)
    for mid in ours:  # to the member that takes it over: the same rendezvous, without b
        owner = rendezvous(("a", "c"), mid)
        assert mid in relay.seen[owner], (mid, owner)
    assert "b" not in relay.seen


def test_a_peer_that_takes_relays_and_never_answers_does_not_hold_the_others():
    """b takes the connection and never answers; c answers. c hears of its machines' heartbeats
    every relay interval all the same: each round waited for every send, b's for its 2 s timeout,
    so c heard every 2 s or so (beside an agent's own wait on a stuck replica, past the heartbeat
    timeout)."""
    import asyncio
    from types import SimpleNamespace

    import aiohttp
    from aiohttp import web

    async def body() -> None:
        arrivals: list[float] = []

        async def hang(request: web.Request) -> web.Response:
            await asyncio.Event().wait()
            return web.json_response({"ok": True})

        async def take(request: web.Request) -> web.Response:
            if (await request.json())["seen"]:
                arrivals.append(time.monotonic())
            return web.json_response({"ok": True})

        runners, urls = [], {}
        for name, handler in (("b", hang), ("c", take)):
            app = web.Application()
            app.router.add_post("/v1/internal/relay", handler)
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        keys = Keys("relay2")
        state = RegionState(None, keys)
        for rev, (mid, url) in enumerate((("a", "http://a"), ("b", urls["b"]), ("c", urls["c"])), 1):
            state._take(keys.member(mid), encode({"id": mid, "url": url, "roles": ["health"]}), rev)  # noqa: SLF001
        coord = Coordinator(None, keys, state, "http://a", ("health",), (), _nothing, _nothing, ttl=2, member_id="a")
        coord.lease, coord.valid_until = 7, time.monotonic() + 60
        agents = SimpleNamespace(reports={}, errors={}, report_at={})
        async with aiohttp.ClientSession() as http:
            relay = Relay(state, agents, None, coord, lambda: http, "token", interval=0.2)
            machines = [f"m{i:03d}" for i in range(60)]
            to_b = [m for m in machines if rendezvous(("a", "b", "c"), m) == "b"]
            to_c = [m for m in machines if rendezvous(("a", "b", "c"), m) == "c"]
            assert to_b and to_c
            running = asyncio.create_task(relay.run())
            began = time.monotonic()
            while time.monotonic() - began < 4.0:
                for m in to_b + to_c:
                    relay.heard(m)
                await asyncio.sleep(0.1)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        for runner in runners:
            await runner.cleanup()
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        print(f"{len(arrivals)} relays reached c in 4 s; longest gap {max(gaps):.2f} s; to b: {relay.counters['failures']} failed")
        assert len(arrivals) >= 10 and max(gaps) < 1.0, (len(arrivals), gaps)

    asyncio.run(body())


def test_each_member_that_takes_it_hears_how_far_behind_the_sender_is_every_beat():
    """An owner measures silence only up to the horizon of every member that may relay it a
    heartbeat (health/check.py), so those members send it, in a relay at least every BEAT seconds
    even when nothing else is owed; a member whose record does not say it takes `behind` (a
    version before it, whose schema refuses the field) is sent none, and no empty relay. The
    receiving side hands it to its health check."""
    import asyncio
    from types import SimpleNamespace

    import aiohttp
    import msgspec
    from aiohttp import web

    from controlplane.broker.relay import BEAT
    from controlplane.frontend.schema import Relay as RelayBody
    from controlplane.health.check import HealthService

    async def body() -> None:
        got: dict[str, list] = {"b": [], "c": []}

        def taker(name: str):
            async def take(request: web.Request) -> web.Response:
                got[name].append(msgspec.json.decode(await request.read(), type=RelayBody))
                return web.json_response({"ok": True})
            return take

        runners, urls = [], {}
        for name in ("b", "c"):
            app = web.Application()
            app.router.add_post("/v1/internal/relay", taker(name))
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        keys = Keys("relay3")
        state = RegionState(None, keys)
        for rev, (mid, url, intake) in enumerate((("a", "http://a", True), ("b", urls["b"], True),
                                                  ("c", urls["c"], False)), 1):
            rec = {"id": mid, "url": url, "roles": ["health"], **({"intake": True} if intake else {})}
            state._take(keys.member(mid), encode(rec), rev)  # noqa: SLF001
        coord = Coordinator(None, keys, state, "http://a", ("health",), (), _nothing, _nothing, ttl=2, member_id="a")
        coord.lease, coord.valid_until = 7, time.monotonic() + 60
        agents = SimpleNamespace(reports={}, errors={}, report_at={})
        async with aiohttp.ClientSession() as http:
            relay = Relay(state, agents, None, coord, lambda: http, "token", interval=0.1)
            relay.behind = lambda: 1.25
            running = asyncio.create_task(relay.run())
            await asyncio.sleep(6 * BEAT)
            to_c = next(m for m in (f"m{i:03d}" for i in range(100)) if rendezvous(("a", "b", "c"), m) == "c")
            relay.heard(to_c)
            deadline = time.monotonic() + 10
            while not got["c"] and time.monotonic() < deadline:
                await asyncio.sleep(relay.interval)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        for runner in runners:
            await runner.cleanup()
        assert len(got["b"]) >= 4, f"{len(got['b'])} relays in {6 * BEAT:g} s"
        assert all(r.behind == 1.25 and r.from_ == "a" and not r.seen for r in got["b"])
        assert [(r.seen, r.behind) for r in got["c"]] == [([to_c], None)], "c: its heartbeat only, no `behind`"

        # b's side: the relay's `behind` sets a's horizon at b's health check
        keys_b, state_b = Keys("relay3"), RegionState(None, Keys("relay3"))
        for rev, mid in enumerate(("a", "b"), 1):
            state_b._take(keys_b.member(mid), encode({"id": mid, "url": f"http://{mid}", "roles": ["health"],  # noqa: SLF001
                                                      "intake": True}), rev)
        health = HealthService(state_b, None, keys_b, {}, timeout=5.0)
        health.coordinator = SimpleNamespace(id="b")
        at_b = Relay(state_b, SimpleNamespace(reports={}, errors={}, report_at={}, last_seen={}, last_seen_wall={}),
                     health, None, lambda: None, "token")
        at_b.receive(got["b"][-1])
        now = time.monotonic()
        assert health.heard.at(now, health.coordinator, state_b.members, 5.0) == now, \
            "a relays b no heartbeat: none of b's waits at a"
        at_b.receive(msgspec.json.decode(b'{"from": "a", "seen": ["m1"], "behind": 1.25}', type=RelayBody))
        now = time.monotonic()
        assert now - 1.35 < health.heard.at(now, health.coordinator, state_b.members, 5.0) <= now - 1.25

    asyncio.run(body())


def test_a_replica_keeps_one_string_a_machine_and_one_report_for_every_machine_without_tasks():
    """Every replica holds every machine's report, relayed to it: at a million machines each
    replica kept, for every machine that heartbeats, an empty dict and a second copy of its id (the
    relay's decoded string as the key of its dicts), about 120 bytes a machine in every process
    (issue #38). The region's own id string and one read-only empty report instead: what is held
    is the same, asked for the same way."""
    import asyncio
    from types import SimpleNamespace

    import msgspec

    from controlplane.broker.agents import NO_TASKS, AgentService
    from controlplane.frontend.schema import Relay as RelayBody
    from controlplane.health.check import HealthService
    from controlplane.store.records import MachineRec

    keys = Keys("relay4")
    state = RegionState(None, keys)
    mids = ("m1", "m2", "m3")
    for rev, mid in enumerate(mids, 1):
        rec = MachineRec(id=mid, hostname=mid, labels={"region": "relay4", "dc": "dc1", "msb": "msb1", "rack": "r1",
                                                       "machine_type": "t1"}, capacity={"cpus": 4, "memory_mb": 4096})
        state._take(keys.machine(mid), encode(rec.to_json()), rev)  # noqa: SLF001
    agents = AgentService(state, None, keys, set())
    health = HealthService(state, None, keys, {}, timeout=5.0)
    health.coordinator = SimpleNamespace(id="b")
    relay = Relay(state, agents, health, None, lambda: None, "token")
    task = {"job": "e/j", "index": 0, "state": "running"}
    relay.receive(msgspec.json.decode(msgspec.json.encode(
        {"from": "a", "seen": ["m1", "m2"], "reports": {"m1": {"tasks": [], "at": 5.0}, "m2": {"tasks": [], "at": 5.0},
                                                        "m3": {"tasks": [task], "at": 5.0}}}), type=RelayBody))

    def key(d: dict, mid: str) -> str:
        return next(k for k in d if k == mid)

    assert set(agents.last_seen) == set(agents.last_seen_wall) == {"m1", "m2"}
    assert set(agents.reports) == set(agents.report_at) == {"m1", "m2", "m3"}
    for held in (agents.last_seen, agents.last_seen_wall, agents.reports, agents.report_at):
        for mid in held:
            assert key(held, mid) is state.machines[mid].id, (mid, "held by its own string, not the region's")
    assert agents.report_of("m1") is NO_TASKS and agents.report_of("m2") is NO_TASKS
    assert agents.report_of("m1") == {} and list(agents.report_of("m1").values()) == []
    assert agents.report_of("m3") == {("e/j", 0): task}
    assert agents.report_with_time("m3")[1] == 5.0
    # m3's task gone: relayed empty, held as the shared empty report; its changes still seen
    relay.receive(msgspec.json.decode(b'{"from": "a", "reports": {"m3": {"tasks": [], "at": 6.0}}}', type=RelayBody))
    assert agents.report_of("m3") is NO_TASKS and agents.report_with_time("m3")[1] == 6.0

    # a heartbeat taken here: its empty report the shared one, and a digest many machines send
    # alike (a profile's, no task) one string
    async def beat(mid: str, tasks: list) -> dict:
        return await agents.heartbeat(mid, {"digest": "".join(("d", "0")), "tasks": tasks, "profile": {}})

    async def beats() -> None:
        for mid in mids:
            await beat(mid, [])
        assert all(agents.report_of(mid) is NO_TASKS for mid in mids)
        assert agents.digests["m1"] is agents.digests["m2"] is agents.digests["m3"]
        await beat("m2", [task])
        assert agents.report_of("m2") == {("e/j", 0): task} and agents.report_of("m1") is NO_TASKS

    asyncio.run(beats())
