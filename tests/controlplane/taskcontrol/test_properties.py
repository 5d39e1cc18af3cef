"""Property-based (hypothesis): the replica-aware TaskController and the scheduler's session,
driven through random shard maps, update batches, completions, failures and recoveries at any
moment, and calls whose answers come late (issue #12: no shard may lose two live replicas).

The session talks to the controller through an in-process transport (named so, a stand-in for
aiohttp's client: the HTTP wire itself is tested in test_session.py and tests/e2e), which holds
each call for a number of steps the example draws: the request reaches the controller at once or
late, its answer comes back at once or late, while passes, failures and completions go on.

The scheduler is modelled as it runs a job's pass (controlplane/scheduler/service.py pass_job):
observe the tasks, take the approvals standing then, offer what the update still wants, start
what was approved. Properties, checked at every step:
- safety: an operation starts only when no other replica of any of its task's shards is down
  (failed, or taken down by an operation of ours), unless its own task is down already;
- liveness: once failures stop and every task is back, the update finishes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.store.records import TaskRec
from controlplane.scheduler.reconcile import Op
from controlplane.taskcontrol.controllers.replica_aware import ReplicaAware
from controlplane.taskcontrol.session import TaskControlSession, unhealthy

H = "ent/cache"
SPEC = {"image": "twine/busybox:1", "command": [], "env": {}, "cpus": 0.5, "memory_mb": 64, "pids": 256,
        "network_mode": "bridge"}


class _Answer:
    def __init__(self, call: "_Call") -> None:
        self.status, self._call = 200, call

    async def json(self, content_type=None) -> dict:
        return self._call.answer


@dataclass
class _Call:
    transport: "InProcessTransport"
    body: dict
    hold_in: int
    hold_out: int
    answer: dict = field(default_factory=dict)

    async def __aenter__(self) -> _Answer:
        t = self.transport
        await t.wait_steps(self.hold_in)  # the request on its way
        self.answer = t.controller.process(self.body)
        await t.wait_steps(self.hold_out)  # the answer on its way back
        return _Answer(self)

    async def __aexit__(self, *exc) -> None:
        return None


class InProcessTransport:
    """aiohttp.ClientSession's `post` for the session, calling the controller in this process."""

    def __init__(self, controller: ReplicaAware, holds) -> None:
        self.controller = controller
        self.holds = holds  # () -> (steps before the controller sees it, steps before the answer is back)
        self.step = 0
        self.calls = 0
        self._tick = asyncio.Event()

    def post(self, url, json, headers=None, timeout=None) -> _Call:
        self.calls += 1
        return _Call(self, json, *self.holds())

    async def wait_steps(self, n: int) -> None:
        until = self.step + n
        while self.step < until:
            await self._tick.wait()

    def advance(self) -> None:
        self.step += 1
        self._tick.set()
        self._tick = asyncio.Event()


@st.composite
def shard_maps(draw) -> tuple[int, dict[str, list[int]]]:
    n = draw(st.integers(3, 16))
    replicas = draw(st.integers(2, min(3, n)))
    count = draw(st.integers(1, 3 * n))
    shards = {f"s{k}": draw(st.lists(st.integers(0, n - 1), min_size=replicas, max_size=replicas, unique=True))
              for k in range(count)}
    return n, shards


ACTIONS = ("pass", "pass", "pass", "complete", "complete", "fail", "recover", "deliver", "deliver")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(shard_maps(), st.data())
def test_no_operation_starts_beside_a_down_replica_and_the_update_finishes(shape, data):
    n, shards = shape
    asyncio.run(asyncio.wait_for(scenario(n, shards, data), 30))


async def scenario(n: int, shards: dict[str, list[int]], data) -> None:
    shards = {k: list(v) for k, v in shards.items()}
    controller = ReplicaAware(shards)
    mates = {i: set() for i in range(n)}
    for replicas in shards.values():
        for i in replicas:
            mates[i] |= set(replicas) - {i}
    # drawn up front (the calls run on the session's own task, in an order the example does not fix)
    held = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=20),
                     label="each call's steps on the way in and on the way back")
    nth = iter(range(10**9))
    transport = InProcessTransport(controller, lambda: held[next(nth) % len(held)])
    interval = data.draw(st.sampled_from([0.0, 1000.0]), label="periodic interval")
    session = TaskControlSession(H, "http://controller.invalid/", lambda: transport, interval=interval, timeout=60)
    version = {i: 1 for i in range(n)}
    failed: set[int] = set()
    started: set[int] = set()  # tasks taken down by an operation of ours, until it completes

    def tasks() -> dict[int, TaskRec]:
        return {i: TaskRec(H, i, version[i], SPEC, f"m{i}",
                           "running" if i not in failed and i not in started else ("lost" if i in failed else "starting"))
                for i in range(n)}

    def one_pass() -> None:
        now = tasks()  # the pass's view: what the reconciler sees, failures included
        session.observe(now)
        session.withdraw_stale(now, n)
        approved = set(session.approved)
        proposed = [Op("restart", i, "update v1 -> v2", f"restart/{i}/v2", f"m{i}", "update", 2)
                    for i in range(n) if version[i] < 2]
        session.offer(proposed, unhealthy(now, n))
        go = [op for op in proposed if op.id in approved and op.id not in session.in_flight]
        for op in go:
            down = (failed | started) - {op.index}
            if op.index not in failed | started:
                assert not mates[op.index] & down, (
                    f"task {op.index} taken down while shard-mates {sorted(mates[op.index] & down)} are down "
                    f"(failed {sorted(failed)}, ours {sorted(started)}); shards {shards}; calls {list(controller.calls)}")
            started.add(op.index)
        session.started([op.id for op in go], go)

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    try:
        await drive(n, data, session, transport, controller, version, failed, started, one_pass, settle)
    finally:
        session.close_now()


async def drive(n, data, session, transport, controller, version, failed, started, one_pass, settle) -> None:
    for _ in range(data.draw(st.integers(5, 80), label="steps")):
        action = data.draw(st.sampled_from(ACTIONS), label="action")
        if action == "pass":
            one_pass()
        elif action == "complete" and started:
            i = data.draw(st.sampled_from(sorted(started)), label="completes")
            started.discard(i)
            version[i] = 2
        elif action == "fail":
            failed.add(data.draw(st.integers(0, n - 1), label="fails"))
        elif action == "recover" and failed:
            failed.discard(data.draw(st.sampled_from(sorted(failed)), label="recovers"))
        elif action == "deliver":
            transport.advance()
        await settle()

    # failures stop, every task comes back: the update must finish
    failed.clear()
    for step in range(40 * n + 100):
        if all(v == 2 for v in version.values()) and not started:
            break
        one_pass()
        for i in sorted(started):
            started.discard(i)
            version[i] = 2
        transport.advance()
        await settle()
    else:
        raise AssertionError(f"the update did not finish: versions {version}, in flight {sorted(session.in_flight)}, "
                             f"approved {sorted(session.approved)}, controller in flight {sorted(controller.in_flight)}")
