"""TaskControlSession, the scheduler's side of the TaskControl protocol, against small HTTP servers
started in the test's own event loop (a stub that answers what the test says, and SDK controllers)."""

from __future__ import annotations

import asyncio
import inspect
import socket
from types import SimpleNamespace
from typing import Any, Callable

import aiohttp
import pytest
from aiohttp import web

from controlplane.store.keys import Keys
from controlplane.store.records import JobRec, TaskRec
from controlplane.store.state import RegionState
from controlplane.scheduler.reconcile import Op
from controlplane.taskcontrol.controllers.leader_last import LeaderLast
from controlplane.taskcontrol.sdk import TaskController, serve
from controlplane.taskcontrol.session import TaskControlSession, done, op_json, unhealthy
from controlplane.taskcontrol.sessions import Sessions

H = "ent/zk"
SPEC = {"image": "twine/busybox:1", "command": [], "env": {}, "cpus": 0.5, "memory_mb": 64, "pids": 256,
        "network_mode": "bridge"}
BODY_KEYS = {"jobHandle", "request", "completed", "advanceNotices", "allUnhealthyTasks", "sequenceNumber"}


def restart(i: int, v: int = 2) -> Op:
    return Op("restart", i, f"update v{v - 1} -> v{v}", f"restart/{i}/v{v}", f"m{i}", "update", v)


def task(i: int, state: str = "running", v: int = 1, machine: str | None = None) -> TaskRec:
    return TaskRec(H, i, v, SPEC, machine or f"m{i}", state, discovery=state == "running")


def run(coro) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 5))


async def until(pred: Callable[[], bool], timeout: float = 1.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.002)


class Stub:
    """A TaskController stand-in: records each body and answers `reply(body)` (a web.Response, or a
    coroutine giving one). By default it acks everything it is asked."""

    def __init__(self, reply: Callable[[dict], Any] | None = None):
        self.bodies: list[dict] = []
        self.reply = reply or (lambda body: web.json_response({"ack": [o["id"] for o in body["request"]]}))
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        r = self.reply(body)
        return await r if inspect.isawaitable(r) else r

    async def __aenter__(self) -> Stub:
        app = web.Application()
        app.router.add_post("/", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"  # noqa: SLF001
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


class Held:
    """A reply that holds each answer until the test lets it go: `arrived` is set when a call has
    reached the controller; `release()` lets the answers out (no sleep decides what is "during")."""

    def __init__(self, answer: Callable[[dict], web.Response]):
        self.answer = answer
        self.arrived = asyncio.Event()
        self._go = asyncio.Event()

    async def __call__(self, body: dict) -> web.Response:
        self.arrived.set()
        await self._go.wait()
        return self.answer(body)

    def release(self) -> None:
        self._go.set()


class Clock:
    """The session's clock, advanced by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Scheduler:
    """The scheduler's use of one session: an HTTP client of its own, and a count of answers."""

    def __init__(self, url: str, interval: float = 60.0, timeout: float = 1.0, clock: Callable[[], float] | None = None):
        self.answers = 0
        self.http: aiohttp.ClientSession | None = None
        self.s = TaskControlSession(H, url, self.client, interval, timeout, on_answer=self.answered,
                                    **({"clock": clock} if clock else {}))

    def client(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession()
        return self.http

    def answered(self) -> None:
        self.answers += 1

    async def offer(self, proposed: list[Op], unhealthy_: list[dict] = (), notices: list[dict] = ()) -> None:
        """Offer, and wait for the call it makes."""
        before = self.answers
        self.s.offer(proposed, list(unhealthy_), list(notices))
        await until(lambda: self.answers > before)

    async def __aenter__(self) -> Scheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.s.close()
        if self.http is not None:
            await self.http.close()


async def served(controller: TaskController) -> tuple[web.AppRunner, str]:
    runner = await serve(controller, "127.0.0.1", 0)
    port = next(iter(runner.sites))._server.sockets[0].getsockname()[1]  # noqa: SLF001
    return runner, f"http://127.0.0.1:{port}/"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- pure helpers ----------------------------------------------------------------------------


def test_op_json_is_the_wire_form():
    assert op_json(H, restart(3)) == {"id": "restart/3/v2", "task": {"job": H, "index": 3, "machine": "m3"},
                                      "kind": "restart", "reason": "update"}
    assert op_json(H, Op("stop", 1, "resize to 1", "stop/1", "m1"))["reason"] == "stop"  # no cause: the kind


def test_unhealthy_lists_the_jobs_tasks_that_are_not_running():
    tasks = {0: task(0), 1: task(1, "failed"), 2: task(2, "lost"), 5: task(5, "starting")}
    assert [u["index"] for u in unhealthy(tasks, 3)] == [1, 2]  # #5 is beyond the count
    assert unhealthy(tasks, 3)[1] == {"job": H, "index": 2, "machine": "m2", "state": "lost", "reason": ""}


def test_done_per_kind():
    assert not done(restart(0), {0: task(0, v=1)})
    assert not done(restart(0), {0: task(0, "starting", v=2)})
    assert done(restart(0), {0: task(0, v=2)})
    move = Op("move", 0, "machine failure", "move/0/m0", "m0", "machine failure")
    assert not done(move, {0: task(0, "lost", machine="m0")})
    assert not done(move, {0: task(0, "starting", machine="m9")})
    assert done(move, {0: task(0, machine="m9")})
    stop = Op("stop", 4, "resize to 4", "stop/4", "m4", "resize")
    assert not done(stop, {4: task(4, "stopping")})
    assert done(stop, {}) and done(stop, {4: task(4, "stopped")})


# -- the call --------------------------------------------------------------------------------


def test_the_request_body_and_increasing_sequence_numbers():
    async def body():
        async with Stub(lambda b: web.json_response({"ack": []})) as stub, Scheduler(stub.url) as sch:
            sick = unhealthy({1: task(1, "failed")}, 3)
            notice = {"id": "n1", "machines": ["m2"], "start": 1.0, "deadline": 2.0, "tasks": [2]}
            await sch.offer([restart(0)], sick, [notice])
            await sch.offer([restart(0), restart(2)], sick)
            await sch.offer([])
            return stub.bodies, sch.s

    bodies, s = run(body())
    assert len(bodies) == 3
    assert all(set(b) == BODY_KEYS for b in bodies)
    first = bodies[0]
    assert first["jobHandle"] == H
    assert first["request"] == [op_json(H, restart(0))]
    assert first["completed"] == []
    assert first["allUnhealthyTasks"] == [{"job": H, "index": 1, "machine": "m1", "state": "failed", "reason": ""}]
    assert first["advanceNotices"][0]["id"] == "n1"
    assert [o["id"] for o in bodies[1]["request"]] == ["restart/0/v2", "restart/2/v2"]
    assert bodies[2]["request"] == [] and bodies[2]["allUnhealthyTasks"] == []
    seqs = [b["sequenceNumber"] for b in bodies]
    assert all(isinstance(n, int) for n in seqs) and seqs == sorted(set(seqs))
    assert s.status["ok"] is True and s.status["error"] == "" and s.status["calls"] == 3
    assert s.status["sequence"] == seqs[-1]


def test_sequence_numbers_increase_across_sessions():
    async def body():
        async with Stub(lambda b: web.json_response({"ack": []})) as stub:
            for _ in range(2):  # a daemon restart: a new session for the same job
                async with Scheduler(stub.url) as sch:
                    await sch.offer([restart(0)])
            return [b["sequenceNumber"] for b in stub.bodies]

    first, second = run(body())
    assert second > first


def test_calls_again_only_when_the_controller_could_approve_something_new():
    """Issue #12: one call per change that can let the controller approve more (a new op, a task
    back up, completions), plus the periodic one; not one per pass."""
    async def body():
        async with Stub(lambda b: web.json_response({"ack": []})) as stub, Scheduler(stub.url) as sch:
            counts = []
            one_down, two_down = unhealthy({1: task(1, "failed")}, 2), unhealthy({1: task(1, "failed"), 2: task(2, "failed")}, 3)
            await sch.offer([restart(0)], one_down)
            counts.append(len(stub.bodies))
            call = sch.s._task
            sch.s.offer([restart(0)], one_down)  # the same: no call (the interval is long)
            sch.s.offer([restart(0)], two_down)  # more down: nothing new to ask
            assert sch.s._task is call and not sch.s._again  # offer makes or queues a call at once: none
            counts.append(len(stub.bodies))
            await sch.offer([restart(0)], unhealthy({2: task(2, "failed")}, 3))  # task 1 is back: it may approve now
            counts.append(len(stub.bodies))
            await sch.offer([restart(0), restart(1)], [])  # a new operation
            counts.append(len(stub.bodies))
            return counts

    assert run(body()) == [1, 1, 2, 3]


def test_calls_again_at_the_interval_while_something_is_pending():
    clock = Clock()

    async def body():
        async with Stub(lambda b: web.json_response({"ack": []})) as stub, \
                Scheduler(stub.url, interval=5.0, clock=clock) as sch:
            await sch.offer([restart(0)])
            clock.now += 4.9
            call = sch.s._task
            sch.s.offer([restart(0)], [])  # unchanged and not due: no call made, none queued
            assert sch.s._task is call and call.done() and not sch.s._again
            clock.now += 0.1
            await sch.offer([restart(0)])  # unchanged, but due
            return len(stub.bodies)

    assert run(body()) == 2


def test_an_offer_during_a_call_leads_to_one_more_call_with_the_latest_set():
    async def body():
        held = Held(lambda b: web.json_response({"ack": []}))
        async with Stub(held) as stub, Scheduler(stub.url) as sch:
            sch.s.offer([restart(0)], [])
            await held.arrived.wait()
            sch.s.offer([restart(1)], [])  # while the first call is out
            held.release()
            await until(lambda: sch.answers >= 2)
            return [[o["id"] for o in b["request"]] for b in stub.bodies]

    assert run(body()) == [["restart/0/v2"], ["restart/1/v2"]]


def test_an_offer_during_an_acking_call_asks_nothing_again():
    """An offer made while a call is out, with the same operations (and one more task down), asks
    the controller nothing it has not just been asked: no second call (issue #12). Asking again
    for restart/0, approved meanwhile, would make the controller take it for an op the scheduler
    dropped and approve a conflicting one next to it."""

    async def body():
        held = Held(lambda b: web.json_response({"ack": [o["id"] for o in b["request"]][:1]}))
        async with Stub(held) as stub, Scheduler(stub.url) as sch:
            sch.s.offer([restart(0), restart(1)], [])
            await held.arrived.wait()
            sch.s.offer([restart(0), restart(1)], [{"index": 5, "state": "lost"}])  # while the first call is out
            held.release()
            await until(lambda: sch.answers >= 1)
            # the next pass: restart/0 approved (still proposed until the scheduler starts it)
            call = sch.s._task
            sch.s.offer([restart(0), restart(1)], [{"index": 5, "state": "lost"}])
            assert sch.s._task is call and call.done() and not sch.s._again  # no call made, none queued
            return [[o["id"] for o in b["request"]] for b in stub.bodies], sorted(sch.s.approved)

    requests, approved = run(body())
    assert requests == [["restart/0/v2", "restart/1/v2"]]
    assert approved == ["restart/0/v2"]


async def slow_answer(body: dict) -> web.Response:
    await asyncio.sleep(0.3)
    return web.json_response({"ack": [o["id"] for o in body["request"]]})


GARBAGE = {
    "not json": (lambda b: web.Response(text="<html>oops</html>", content_type="text/html"), "JSONDecodeError"),
    "ack not a list": (lambda b: web.json_response({"ack": "restart/0/v2"}), '{"ack": [op id, ...]}'),
    "not an object": (lambda b: web.json_response(["restart/0/v2"]), '{"ack": [op id, ...]}'),
    "non-string ids": (lambda b: web.json_response({"ack": [0]}), "strings"),
    "unknown id": (lambda b: web.json_response({"ack": ["restart/0/v2", "restart/9/v2"]}),
                   "not asked about: restart/9/v2"),
    "HTTP 500": (lambda b: web.json_response({"ack": ["restart/0/v2"]}, status=500), "HTTP 500"),
    "slow": (slow_answer, "Timeout"),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_a_garbage_answer_acks_nothing(case):
    reply, why = GARBAGE[case]

    async def body():
        async with Stub(reply) as stub, Scheduler(stub.url, timeout=0.1) as sch:
            await sch.offer([restart(0), restart(1)])
            return sch.s

    s = run(body())
    assert s.approved == set()
    assert s.status["ok"] is False and why in s.status["error"], s.status
    assert s.calls[-1]["ack"] == [] and s.calls[-1]["error"] == s.status["error"]
    assert s.answer()["ok"] is False and s.answer()["pending"] == ["restart/0/v2", "restart/1/v2"]


def test_an_unreachable_controller_acks_nothing():
    async def body():
        async with Scheduler(f"http://127.0.0.1:{closed_port()}/") as sch:
            await sch.offer([restart(0)])
            return sch.s

    s = run(body())
    assert s.approved == set()
    assert s.status["ok"] is False and "Connect" in s.status["error"], s.status


def test_a_good_answer_after_a_bad_one_clears_the_error():
    answers = iter([web.json_response({}, status=503), web.json_response({"ack": ["restart/0/v2"]})])

    async def body():
        # the default interval (60 s): "at once" below holds however slow the host (with 50 ms, a
        # loaded host's next offer came after the interval and called again)
        async with Stub(lambda b: next(answers)) as stub, Scheduler(stub.url) as sch:
            await sch.offer([restart(0)])
            assert sch.s.status["ok"] is False and sch.s.status["error"] == "ValueError: HTTP 503"
            call = sch.s._task
            sch.s.offer([restart(0)], [])  # at once: not called again (no loop against a failing controller)
            assert sch.s._task is call and not sch.s._again and len(stub.bodies) == 1
            sch.s._last_call_at -= sch.s.interval  # the interval has passed (no waiting on the clock)
            await sch.offer([restart(0)], [])  # called again
            return sch.s

    s = run(body())
    assert s.status["ok"] is True and s.status["error"] == "" and s.approved == {"restart/0/v2"}


# -- the op lifecycle ------------------------------------------------------------------------


def test_acked_then_started_then_observed_done_is_reported_completed_once():
    ops = [restart(0), restart(1)]

    async def body():
        async with Stub(lambda b: web.json_response({"ack": [o["id"] for o in b["request"] if o["id"] == "restart/0/v2"]})) \
                as stub, Scheduler(stub.url) as sch:
            s = sch.s
            await sch.offer(ops)
            assert s.approved == {"restart/0/v2"} and s.approved_ops["restart/0/v2"] == op_json(H, ops[0])
            assert s.in_flight == {}
            s.started(["restart/0/v2"], ops)  # the scheduler committed it
            assert s.approved == set() and s.in_flight == {"restart/0/v2": ops[0]}
            s.observe({0: task(0, "starting", v=2), 1: task(1)})
            assert s.in_flight and s.completed == []  # not running again yet
            s.observe({0: task(0, v=2), 1: task(1)})
            assert s.in_flight == {} and s.completed == [{**op_json(H, ops[0]), "outcome": "done"}]
            await sch.offer([ops[1]])  # a completion to report: a call
            await sch.offer([ops[1], restart(2)])  # a new op: a call, without the completion again
            return stub.bodies

    bodies = run(body())
    assert bodies[1]["completed"] == [{**op_json(H, restart(0)), "outcome": "done"}]
    assert [o["id"] for o in bodies[1]["request"]] == ["restart/1/v2"]  # neither approved nor in flight again
    assert bodies[2]["completed"] == []  # reported once


def test_an_approved_op_that_is_no_longer_proposed_is_reported_cancelled_once():
    ops = [restart(0), restart(1)]

    async def body():
        async with Stub() as stub, Scheduler(stub.url) as sch:
            s = sch.s
            await sch.offer(ops)
            assert s.approved == {"restart/0/v2", "restart/1/v2"}
            s.started(["restart/1/v2"], ops)
            await sch.offer([ops[1]])  # #0 is not wanted any more (e.g. its machine came back)
            assert s.approved == set() and s.approved_ops == {}
            await sch.offer([restart(2)], unhealthy({1: task(1, "starting")}, 2))
            return stub.bodies, s

    bodies, s = run(body())
    assert bodies[1]["completed"] == [{**op_json(H, restart(0)), "outcome": "cancelled"}]
    assert bodies[1]["request"] == []  # #1 is in flight, not pending
    assert bodies[2]["completed"] == []
    assert s.in_flight == {"restart/1/v2": restart(1)}  # in flight is not cancelled by the proposal going away


def test_acks_arriving_for_ops_not_wanted_any_more_come_back_cancelled():
    async def body():
        held = Held(lambda b: web.json_response({"ack": [o["id"] for o in b["request"]]}))
        async with Stub(held) as stub, Scheduler(stub.url) as sch:
            sch.s.offer([restart(0)], [])
            await held.arrived.wait()
            sch.s.offer([], [])  # withdrawn while the call is out
            held.release()
            await until(lambda: sch.answers >= 1)
            await sch.offer([], [])  # the pass after the answer: the acked op comes back cancelled
            return stub.bodies, sch.s

    bodies, s = run(body())
    assert s.approved == set()
    assert [o["id"] for b in bodies for o in b["completed"]] == ["restart/0/v2"]
    assert bodies[-1]["completed"][0]["outcome"] == "cancelled"


def test_with_an_sdk_controller_end_to_end():
    """LeaderLast served by the SDK: one member at a time, followers first, leader last."""
    ops = [restart(0), restart(1), restart(2)]
    controller = LeaderLast(lambda: 0)

    async def body():
        runner, url = await served(controller)
        try:
            async with Scheduler(url) as sch:
                s, tasks, order = sch.s, {i: task(i) for i in range(3)}, []
                wanted = list(ops)
                while wanted:
                    await sch.offer(wanted, unhealthy(tasks, 3))
                    (op_id,) = s.approved
                    op = next(o for o in wanted if o.id == op_id)
                    order.append(op.index)
                    s.started([op_id], wanted)
                    wanted.remove(op)
                    tasks[op.index] = task(op.index, "starting", v=2)
                    s.observe(tasks)
                    call = s._task
                    sch.s.offer(wanted, unhealthy(tasks, 3))  # nothing new to ask: no call
                    assert s._task is call and not s._again and s.approved == set()  # a member is down (and one in flight): nothing more
                    tasks[op.index] = task(op.index, v=2)
                    s.observe(tasks)
                await sch.offer([], unhealthy(tasks, 3))
                return order
        finally:
            await runner.cleanup()

    assert run(body()) == [1, 2, 0]
    assert controller.in_flight == {} and controller.completed == 3


def test_a_completion_is_reported_again_after_a_failed_call():
    answers = iter([web.json_response({"ack": ["restart/0/v2"]}), web.json_response({}, status=500)])

    clock = Clock()

    async def body():
        async with Stub(lambda b: next(answers, web.json_response({"ack": []}))) as stub, \
                Scheduler(stub.url, interval=5.0, clock=clock) as sch:
            s = sch.s
            await sch.offer([restart(0)])
            s.started(["restart/0/v2"], [restart(0)])
            s.observe({0: task(0, v=2)})
            await sch.offer([])  # this call fails (HTTP 500): the controller did not hear of it
            assert s.status["ok"] is False
            clock.now += 5.0
            await sch.offer([], unhealthy({1: task(1, "failed")}, 2))  # at the interval: told again
            return stub.bodies

    bodies = run(body())
    assert [o["id"] for o in bodies[2]["completed"]] == ["restart/0/v2"]


def test_an_approval_is_withdrawn_when_a_task_went_down_after_it_and_asked_again():
    """Issue #12 (cause 2): the controller approved #0 while every task ran; #1, a shard-mate, fails
    before the pass that would start #0. The pass withdraws the approval (it was given
    for a state that is gone): #0 is not started, the controller hears `cancelled`, and is asked
    again with #1 in allUnhealthyTasks. An approval given because its task was down is withdrawn
    too once that task is up again."""
    async def body() -> None:
        async with Stub() as stub, Scheduler(stub.url) as sched:
            tasks = {0: task(0), 1: task(1)}
            await sched.offer([restart(0)], unhealthy(tasks, 2))
            assert sched.s.approved == {"restart/0/v2"}

            tasks[1] = task(1, "lost")
            sched.s.observe(tasks)
            assert sched.s.withdraw_stale(tasks, 2)
            assert sched.s.approved == set() and sched.s.withdrawn == 1
            await sched.offer([restart(0), restart(1)], unhealthy(tasks, 2))
            last = stub.bodies[-1]
            assert [c["id"] for c in last["completed"]] == ["restart/0/v2"]
            assert last["completed"][0]["outcome"] == "cancelled"
            assert {op["id"] for op in last["request"]} == {"restart/0/v2", "restart/1/v2"}
            assert [u["index"] for u in last["allUnhealthyTasks"]] == [1]

            # the stub acked both: #1's because it was down; #1 comes back before it started
            tasks[1] = task(1)
            assert sched.s.withdraw_stale(tasks, 2)
            assert "restart/1/v2" not in sched.s.approved and sched.s.withdrawn == 2

    run(body())


def test_a_completion_the_controller_has_not_heard_of_is_kept_for_the_next_leader():
    """An operation completes; the call that reports it is out when a commit of the same job
    writes its TaskControl record, without the operation (no longer in flight); the leader dies
    before the answer. The record keeps the completion, and the next leader's session reports it:
    else nobody would, and a controller like the SDK's keeps the operation in flight for ever
    (one that waits for its ops to complete, as leader_last, never acks again)."""
    op = restart(0)
    keys = Keys("tc")

    async def body():
        completions = []

        def reply(b: dict):
            if b["completed"]:
                completions.append(b["completed"])
                if len(completions) == 1:  # the first leader's report: never answered
                    return asyncio.sleep(30, web.json_response({"ack": []}))
            return web.json_response({"ack": [o["id"] for o in b["request"]]})

        async with Stub(reply) as stub, aiohttp.ClientSession() as http:
            job = JobRec("ent", "zk", 2, SPEC, controller=stub.url)
            first = Sessions(RegionState(None, keys), keys)
            first.http = lambda handle: http
            s = first.of(job)
            s.offer([op], [], [])
            await until(lambda: s.approved == {op.id})
            s.started([op.id], [op])
            first.state.taskcontrol.update(
                {H: first.in_flight_record(H, s, SimpleNamespace(ops=[op]), [op.id])[keys.taskcontrol(H)]})
            s.observe({0: task(0, v=2), 1: task(1)})  # done
            s.offer([], [], [])
            await until(lambda: completions)  # the report is out
            record = first.in_flight_record(H, s, SimpleNamespace(ops=[]), [])[keys.taskcontrol(H)]
            assert record["in_flight"] == [] and [c["id"] for c in record.get("completed", [])] == [op.id], record
            await first.close()  # the leader is gone before the answer

            second = Sessions(RegionState(None, keys), keys)
            second.http = lambda handle: http
            second.state.taskcontrol[H] = record
            s2 = second.of(job)
            s2.offer([], [], [])
            await until(lambda: len(completions) == 2)
            await until(lambda: s2.status["ok"])
            assert [c["id"] for c in completions[1]] == [op.id] and completions[1][0]["outcome"] == "done"
            assert "completed" not in second.in_flight_record(H, s2, SimpleNamespace(ops=[]), [])[keys.taskcontrol(H)]
            await second.close()

    run(body())
