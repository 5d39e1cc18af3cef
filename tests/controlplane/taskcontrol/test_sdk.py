"""The TaskController SDK: the bookkeeping of `process`, and the controller served over HTTP."""

from __future__ import annotations

import asyncio

import aiohttp

from controlplane.taskcontrol.sdk import Background, Operation, Request, TaskController, parse_request

H = "ent/zk"


def op(i: int, kind: str = "restart", reason: str = "update") -> dict:
    return {"id": f"{kind}/{i}/v2", "task": {"job": H, "index": i, "machine": f"m{i}"}, "kind": kind, "reason": reason}


def done(o: dict, outcome: str = "done") -> dict:
    return {**o, "outcome": outcome}


def body(seq: int, request=(), completed=(), unhealthy=(), notices=()) -> dict:
    return {"jobHandle": H, "request": list(request), "completed": list(completed),
            "advanceNotices": list(notices), "allUnhealthyTasks": list(unhealthy), "sequenceNumber": seq}


class Scripted(TaskController):
    """Answers whatever `choose(request)` says; remembers each request it decided on."""

    def __init__(self, choose=lambda request: [o.id for o in request.ops]):
        super().__init__()
        self.choose = choose
        self.seen: list[Request] = []

    def decide(self, request: Request):
        self.seen.append(request)
        return self.choose(request)


def test_parse_request_reads_the_wire_form():
    r = parse_request(body(7, [op(1)], [done(op(0))], unhealthy=[{"job": H, "index": 2, "machine": "m2",
                                                                  "state": "lost", "reason": "machine gone"}],
                           notices=[{"id": "n1", "machines": ["m3"], "start": 10, "deadline": 20, "tasks": [3]}]))
    assert r.job == H and r.sequence == 7
    assert r.ops == (Operation("restart/1/v2", H, 1, "m1", "restart", "update"),)
    assert [o.id for o in r.completed] == ["restart/0/v2"]
    assert r.unhealthy_indices() == {2} and r.unhealthy[0].state == "lost"
    assert r.notices[0].id == "n1" and r.notices[0].machines == ("m3",) and r.notices[0].tasks == (3,)


def test_acks_only_the_ids_it_was_asked_about():
    c = Scripted(lambda r: ["restart/1/v2", "stop/9", "restart/1/v2", "restart/2/v2"])
    assert c.process(body(1, [op(1), op(2)])) == {"ack": ["restart/1/v2", "restart/2/v2"]}
    assert set(c.in_flight) == {"restart/1/v2", "restart/2/v2"}


def test_its_log_says_each_decision_once_and_each_completion(caplog):
    c = Scripted(lambda r: [o.id for o in r.ops if o.index != 2])
    with caplog.at_level("INFO", logger="twine.taskcontrol.sdk"):
        c.process(body(1))  # nothing asked, nothing completed: no line
        c.process(body(2, [op(1), op(2)], unhealthy=[{"job": H, "index": 4, "machine": "m4", "state": "lost"}]))
        c.process(body(3, [op(2)]))  # the op it holds back, asked again: a new decision
        c.process(body(4, [op(2)]))  # and again: the same decision, no line
        c.process(body(5, completed=[done(op(1))]))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"{H}: call 2: asked ['restart/1/v2', 'restart/2/v2']; acked ['restart/1/v2']; completed -; "
                     "unhealthy [4]",
                     f"{H}: call 3: asked ['restart/2/v2']; acked -; completed -; unhealthy -",
                     f"{H}: call 5: asked -; acked -; completed ['restart/1/v2']; unhealthy -"], lines


def test_decide_may_return_operations_or_ids():
    c = Scripted(lambda r: [r.ops[0], r.ops[1].id])
    assert c.process(body(1, [op(0), op(1), op(2)])) == {"ack": ["restart/0/v2", "restart/1/v2"]}
    assert c.in_flight["restart/0/v2"].index == 0 and c.in_flight["restart/1/v2"].machine == "m1"


def test_in_flight_holds_acked_ops_until_they_come_back_completed():
    c = Scripted()
    c.process(body(1, [op(0), op(1)]))
    assert set(c.in_flight) == {"restart/0/v2", "restart/1/v2"}
    # not completed yet, nothing new asked: still in flight; decide sees it so
    c.choose = lambda r: []
    assert c.process(body(2)) == {"ack": []}
    assert set(c.in_flight) == {"restart/0/v2", "restart/1/v2"} and c.completed == 0
    c.process(body(3, completed=[done(op(0))]))
    assert set(c.in_flight) == {"restart/1/v2"} and c.completed == 1
    c.process(body(4, completed=[done(op(1), "cancelled")]))
    assert c.in_flight == {} and c.completed == 2
    # a completion it never approved (or reported twice) changes nothing
    c.process(body(5, completed=[done(op(1)), done(op(7))]))
    assert c.in_flight == {} and c.completed == 2


def test_decide_sees_in_flight_after_the_bookkeeping():
    snapshots = []

    def choose(r: Request):
        snapshots.append(set(c.in_flight))
        return [o.id for o in r.ops]

    c = Scripted(choose)
    c.process(body(1, [op(0), op(1), op(2)]))
    c.process(body(2, [op(1)], completed=[done(op(0))]))
    # #0 completed and #1 asked again: only #2 is in flight when decide runs
    assert snapshots == [set(), {"restart/2/v2"}]
    assert set(c.in_flight) == {"restart/1/v2", "restart/2/v2"}


def test_an_op_asked_again_leaves_in_flight():
    c = Scripted()
    c.process(body(1, [op(0)]))
    assert set(c.in_flight) == {"restart/0/v2"}
    c.choose = lambda r: []
    assert c.process(body(2, [op(0)])) == {"ack": []}  # the scheduler did not act on it: asked again
    assert c.in_flight == {} and c.completed == 0
    c.choose = lambda r: [o.id for o in r.ops]
    assert c.process(body(3, [op(0)])) == {"ack": ["restart/0/v2"]}
    assert set(c.in_flight) == {"restart/0/v2"}


def test_a_stale_or_repeated_sequence_number_gets_no_acks():
    c = Scripted()
    assert c.process(body(10, [op(0)])) == {"ack": ["restart/0/v2"]}
    assert c.process(body(10, [op(1)])) == {"ack": []}  # repeated
    assert c.process(body(3, [op(1)])) == {"ack": []}  # old
    # the stale calls were not decided on and acked nothing
    assert len(c.seen) == 1 and set(c.in_flight) == {"restart/0/v2"} and c.last_sequence == 10
    assert c.process(body(11, [op(1)])) == {"ack": ["restart/1/v2"]}
    assert [call["sequence"] for call in c.calls] == [10, 11]


def test_a_stale_calls_completions_are_taken_all_the_same():
    """Issue #12: the scheduler reports each completion once; a controller that dropped it with a
    stale call kept the op in flight for ever (a controller that waits for its in-flight ops to
    finish then stalls the job)."""
    c = Scripted()
    assert c.process(body(10, [op(0)])) == {"ack": ["restart/0/v2"]}
    assert c.process(body(9, [op(1)], completed=[done(op(0))])) == {"ack": []}  # stale: no decision
    assert c.in_flight == {} and c.completed == 1 and len(c.seen) == 1


def test_calls_keep_a_history_of_what_was_asked_and_acked():
    c = Scripted(lambda r: ["restart/2/v2"])
    c.process(body(1, [op(2), op(1)], unhealthy=[{"job": H, "index": 3, "state": "failed"}],
                   notices=[{"id": "n9"}]))
    assert list(c.calls) == [{"sequence": 1, "request": ["restart/1/v2", "restart/2/v2"], "ack": ["restart/2/v2"],
                              "completed": [], "unhealthy": [3], "notices": ["n9"]}]


async def post(url: str, data: bytes | None = None, json: object = None) -> tuple[int, object]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=data, json=json, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.json(content_type=None)


def test_served_over_http_answers_acks():
    c = Scripted(lambda r: [o.id for o in r.ops if o.index != 1])
    with Background(c) as url:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/")
        status, answer = asyncio.run(post(url, json=body(1, [op(0), op(1), op(2)])))
        assert status == 200 and answer == {"ack": ["restart/0/v2", "restart/2/v2"]}
        status, answer = asyncio.run(post(url, json=body(1, [op(1)])))
        assert status == 200 and answer == {"ack": []}  # a repeated sequence number
    assert set(c.in_flight) == {"restart/0/v2", "restart/2/v2"}


def test_served_over_http_refuses_a_body_that_is_not_a_json_object():
    c = Scripted()
    with Background(c) as url:
        status, answer = asyncio.run(post(url, data=b"not json {"))
        assert status == 400 and "error" in answer
        status, answer = asyncio.run(post(url, json=[1, 2]))
        assert status == 400 and "not a JSON object" in answer["error"]
        status, answer = asyncio.run(post(url, json=body(1, [{"task": {"index": 0}}])))  # an op without id
        assert status == 400
    assert c.seen == [] and c.last_sequence == -1
