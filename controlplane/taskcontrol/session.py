"""The scheduler's side of one job's TaskController (paper Figure 8; DESIGN.md wire contract).

`POST <controller>` with {jobHandle, request, completed, advanceNotices, allUnhealthyTasks,
sequenceNumber}; the answer {ack: [op id]} approves any subset of `request`. The session calls
again whenever the pending set (or what completed) changes, and every `interval` seconds while
anything is pending. A controller that is slow, unreachable, answers garbage or acks an id it was
not asked about acks nothing, and `status` says why.

Op lifecycle here: pending (proposed by the reconciler) -> approved (acked) -> in flight (the
scheduler committed it) -> completed (the task runs again at its target, or is gone) -> reported
once in `completed` with "outcome": "done". An approved op that is no longer wanted before it ran
(its failed machine came back) is reported in `completed` with "outcome": "cancelled".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Awaitable, Callable, Container, Mapping

import aiohttp

from controlplane.store.records import TaskRec
from controlplane.scheduler.reconcile import Op
from controlplane.taskcontrol.reach import Refused

log = logging.getLogger("twine.controld.taskcontrol")
HISTORY = 50
# answers without an ack after which an operation counts as refused by the controller: the SRM
# offers another task to stop, the ReBalancer drops the move (see `declined`)
DECLINED = 3


def op_json(handle: str, op: Op) -> dict:
    return {"id": op.id, "task": {"job": handle, "index": op.index, "machine": op.machine},
            "kind": op.kind, "reason": op.cause or op.kind}


def unhealthy(tasks: Mapping[int, TaskRec], live: int | Container[int]) -> list[dict]:
    """The job's tasks (`live`: JobRec.live_set, or a count n: tasks 0..n-1) that do not run."""
    live = range(live) if isinstance(live, int) else live
    return [{"job": t.job, "index": t.index, "machine": t.machine, "state": t.state, "reason": t.reason}
            for i, t in sorted(tasks.items()) if i in live and t.state != "running"]


def done(op: Op, tasks: Mapping[int, TaskRec]) -> bool:
    """Whether an operation the scheduler started has finished: the task is gone (a stop), runs at
    the new spec version (an update), or runs on another machine (a move)."""
    t = tasks.get(op.index)
    if op.kind == "stop":
        return t is None or t.state == "stopped"
    if op.kind == "reclaim":  # off the machine taken back (pending, or placed elsewhere)
        return t is None or t.machine != op.machine
    if t is None or t.state != "running":
        return False
    if op.kind == "reprofile":  # it runs again, on its machine, after the switch
        return True
    if op.version is not None:
        return t.spec_version >= op.version
    return t.machine != op.machine


class TaskControlSession:
    def __init__(self, handle: str, url: str, http: Callable[[], aiohttp.ClientSession],
                 interval: float = 1.0, timeout: float = 2.0, on_answer: Callable[[], None] | None = None,
                 epoch: Callable[[], int] | None = None, token: str | None = None,
                 round_trip: Callable[[float, bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 prepare: Callable[[], Awaitable[None]] | None = None,
                 on_refused: Callable[[str], None] | None = None):
        self.handle = handle
        self.clock = clock  # when the periodic call is due (tests advance their own)
        self.round_trip = round_trip  # (seconds, answered ok): the daemon's histogram
        self.url = url
        self.token = token  # the job's controller_token: the controller checks it
        self.sealed_token: str | None = None  # the token as the job's record holds it (sealed at rest)
        self.http = http
        self.prepare = prepare  # awaited before each call (the addresses the controller may not be at)
        self.on_refused = on_refused  # a call refused at the controller's address (reach.py): why
        self.interval = interval
        self.timeout = timeout
        self.on_answer = on_answer
        self.pending: dict[str, dict] = {}
        self.approved: set[str] = set()
        self.approved_ops: dict[str, dict] = {}  # the wire form of each approved op
        self.in_flight: dict[str, Op] = {}
        self.declined: dict[str, int] = {}  # pending op id -> answers that did not ack it
        self.completed: list[dict] = []  # finished, not yet reported
        self.unhealthy: list[dict] = []
        self.notices: list[dict] = []
        # Increases with every call, also across daemon restarts and changes of leader: with an
        # `epoch` (the etcd revision the scheduler has seen), (epoch << 20) + calls. A new leader
        # was elected at a revision after everything its predecessor saw, so its numbers are higher
        # whatever the hosts' clocks say. Without one (a lone session), the clock in milliseconds.
        self.epoch = epoch
        self.seq = 0 if epoch is not None else int(time.time() * 1000)
        self.status: dict = {"calls": 0, "ok": None, "error": "", "last_call": None}
        self.calls: deque[dict] = deque(maxlen=HISTORY)  # what was sent and acked, for job status
        self._last_sent: tuple = ()  # (ops asked, tasks said down, notices) in the last call
        # completions sent in a call (still out, or whose answer failed): not a reason to call again
        self._told_completed: set[str] = set()
        self._out: list[dict] = []  # the completions of the call out now
        self._last_call_at = 0.0
        self._task: asyncio.Task | None = None
        self._again = False
        self._seen_down: dict[str, frozenset[int]] = {}  # approved op -> the tasks said down in the call that approved it
        self.withdrawn = 0  # approvals withdrawn because a task went down after them

    # -- driven by the scheduler, once per pass ------------------------------------------------

    def unreported(self) -> list[dict]:
        """The completions the controller has not heard of in an answered call yet (in the call
        out now, or waiting for the next): kept in etcd with the operations in flight, so that a
        new leader tells it (Sessions.in_flight_record)."""
        return [*self._out, *self.completed]

    def observe(self, tasks: Mapping[int, TaskRec]) -> None:
        """At the start of a pass: in-flight operations that finished become completions."""
        for op_id, op in list(self.in_flight.items()):
            if done(op, tasks):
                del self.in_flight[op_id]
                self.completed.append({**op_json(self.handle, op), "outcome": "done"})

    def withdraw_stale(self, view: Mapping[int, TaskRec], live: int | Container[int] | None = None) -> bool:
        """An approval holds for the state the controller was told of (issue #12, a cause of two
        replicas of a shard down together: a task failed between the answer and the pass that
        starts the operation). `view`: the job's tasks as the pass found them, live reports and
        machine health included, before the pass's own operations (JobPlan.seen), not the stored
        records, which lag. A task down now that was not down then, other than the
        operation's own and those of our operations in flight, withdraws every approval not yet
        started: each is reported `cancelled` and asked again, with the new failure in
        `allUnhealthyTasks`, so the controller decides anew. So is an approval of an operation on
        a task that was down then and is up now (it was approved as taking no replica down).
        True if any was withdrawn: the pass plans again without it."""
        if not self.approved:
            return False
        live = range(live) if isinstance(live, int) else live
        down = {i for i, t in view.items() if t.state != "running" and (live is None or i in live)}
        ours = {op.index for op in self.in_flight.values()}  # down by our doing (an approval alone takes none down)
        withdrawn = False
        for op_id in sorted(self.approved):
            seen = self._seen_down.get(op_id, frozenset())
            index = self.approved_ops[op_id]["task"]["index"] if op_id in self.approved_ops else None
            new = down - seen - ours - {index}  # its own task going down takes no further replica down
            # approved because its task was down anyway (it takes no replica down), and now it is up:
            # starting it would take one down (found by tests/controlplane/taskcontrol/test_properties.py)
            back = index in seen and index not in down
            if not new and not back:
                continue
            self.approved.discard(op_id)
            self._seen_down.pop(op_id, None)
            if op_id in self.approved_ops:
                self.completed.append({**self.approved_ops.pop(op_id), "outcome": "cancelled"})
            self.withdrawn += 1
            withdrawn = True
            log.info("%s: approval of %s withdrawn: %s since the controller gave it", self.handle, op_id,
                     f"task(s) {sorted(new)} went down" if new else f"its task {index} is up again")
        return withdrawn

    def offer(self, proposed: list[Op], unhealthy: list[dict], notices: list[dict] = ()) -> None:
        """The disruptive operations the job wants now; calls the controller if anything changed
        or, while something is pending, when the interval has passed."""
        self.pending = {op.id: op_json(self.handle, op) for op in proposed
                        if op.id not in self.in_flight and op.id not in self.approved}
        self.declined = {k: v for k, v in self.declined.items() if k in self.pending}
        wanted = {op.id for op in proposed}
        for op_id in sorted(self.approved - wanted):
            # approved, but no longer wanted (the failed machine came back, the job changed): the
            # operation is over without running; the controller hears so in `completed`
            self.completed.append({**self.approved_ops[op_id], "outcome": "cancelled"})
            self.approved.discard(op_id)
        self.approved_ops = {k: v for k, v in self.approved_ops.items() if k in self.approved}
        self._seen_down = {k: v for k, v in self._seen_down.items() if k in self.approved}
        self.unhealthy = unhealthy
        self.notices = list(notices)
        # One call per change that can let the controller approve something, plus the periodic
        # one while something is pending (issue #12: each step made three calls in 20 ms, the
        # same request asked again after every ack and every commit): an operation it was not
        # asked about yet, completions to report, a task no longer down, a changed notice. Ops
        # leaving the request (approved, dropped) or more tasks down ask nothing new.
        sent_ops, sent_down, sent_notices = self._last_sent or (frozenset(), frozenset(), ())
        asking = frozenset(self.pending)
        down = frozenset(u["index"] for u in unhealthy)
        changed = bool(asking - sent_ops) or bool(sent_down - down) or self._notices_key() != sent_notices \
            or any(c["id"] not in self._told_completed for c in self.completed)
        # a failed call is not tried again at once (the answer wakes the scheduler, whose pass
        # would call again: a loop against a dead controller), but at the interval
        due = (self.pending or self.notices or self.completed) and self.clock() - self._last_call_at >= self.interval
        if changed or due:
            self._kick()

    def _notices_key(self) -> tuple:
        return tuple((n.get("id"), n.get("phase"), tuple(n.get("tasks", ()))) for n in self.notices)

    def started(self, op_ids: list[str], ops: list[Op]) -> None:
        by_id = {op.id: op for op in ops}
        for op_id in op_ids:
            self.approved.discard(op_id)
            self._seen_down.pop(op_id, None)
            if op_id in by_id:
                self.in_flight[op_id] = by_id[op_id]

    def finish(self, op_id: str, outcome: str) -> None:
        """An operation in flight that ended without its effect (a move given up: the task stays
        where it was): the controller hears of it in `completed` with that outcome."""
        op = self.in_flight.pop(op_id, None)
        if op is not None:
            self.completed.append({**op_json(self.handle, op), "outcome": outcome})

    def answer(self) -> dict:
        return {"url": self.url, **self.status, "pending": sorted(self.pending), "approved": sorted(self.approved),
                "in_flight": sorted(self.in_flight), "withdrawn": self.withdrawn,
                "recent_calls": list(self.calls)[-10:]}

    def close_now(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        self.close_now()

    # -- the call ----------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._call())

    async def _call(self) -> None:
        while True:
            self._again = False
            await self._call_once()
            if not self._again:
                return

    async def _call_once(self) -> None:
        self.seq = max(self.seq + 1, (self.epoch() << 20) if self.epoch is not None else 0)
        completed, self.completed = self.completed, []
        self._out = completed
        # pending as of the last pass, less what an answer approved since (a call queued while the
        # previous one was out must not ask again: the controller would take an approved op for one
        # the scheduler dropped, and could approve a conflicting one next to it)
        request = [op for op_id, op in self.pending.items() if op_id not in self.approved and op_id not in self.in_flight]
        body = {"jobHandle": self.handle, "request": request, "completed": completed,
                "advanceNotices": self.notices, "allUnhealthyTasks": self.unhealthy, "sequenceNumber": self.seq}
        # what the controller has now been told: the next offer calls only for something beyond it
        told = {op["id"] for op in completed}
        self._told_completed |= told
        self._last_sent = (frozenset(op["id"] for op in request), frozenset(u["index"] for u in self.unhealthy),
                           self._notices_key())
        self._last_call_at = self.clock()
        acked, error = [], ""
        if self.prepare is not None:
            await self.prepare()
        sent = time.monotonic()  # the round trip is the call's, not the preparation's
        try:
            acked = await self._post(body, {op["id"] for op in request})
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, TypeError) as e:
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            acked = []
            refused = getattr(e, "os_error", None)
            if isinstance(refused, Refused) and self.on_refused is not None:
                self.on_refused(refused.strerror)
        if self.round_trip is not None:
            self.round_trip(time.monotonic() - sent, not error)
        self._out = []
        if error:
            self.completed = completed + self.completed  # not heard: say it again next call
        else:
            self._told_completed -= told
        if not error:
            # asked and answered without an ack: how many times, for whoever may offer another
            # operation instead (the SRM offers another task to stop: srm/service.py)
            for op in request:
                if op["id"] not in acked:
                    self.declined[op["id"]] = self.declined.get(op["id"], 0) + 1
        self.approved |= set(acked)
        self.approved_ops.update({op["id"]: op for op in request if op["id"] in acked})
        self._seen_down.update((op_id, self._last_sent[1]) for op_id in acked)  # the tasks this call said were down
        self.status = {"calls": self.status["calls"] + 1, "ok": not error, "error": error, "last_call": time.time(),
                       "sequence": self.seq}
        self.calls.append({"sequence": self.seq, "request": [op["id"] for op in request],
                           "completed": [op["id"] for op in completed], "ack": acked, "error": error,
                           "notices": [n.get("id") for n in self.notices]})
        if error:
            log.warning("%s: TaskController %s acked nothing: %s", self.handle, self.url, error)
        if self.on_answer is not None:
            self.on_answer()

    async def dry_call(self, request: list[dict], completed: list[dict], unhealthy: list[dict], run_id: str,
                       end: bool = False) -> list[str]:
        """One call of a dry run (`dryRun: true`: what would the controller ack?), numbered in
        this session's sequence (never stale to the controller, nor making the session's next
        real call look stale). Its acks, checked as a real call's; ValueError (or aiohttp's
        errors) when the controller did not answer one."""
        self.seq = max(self.seq + 1, (self.epoch() << 20) if self.epoch is not None else 0)
        body = {"jobHandle": self.handle, "request": request, "completed": completed, "advanceNotices": self.notices,
                "allUnhealthyTasks": unhealthy, "sequenceNumber": self.seq, "dryRun": True, "dryRunId": run_id,
                "dryRunEnd": end}
        if self.prepare is not None:
            await self.prepare()
        return await self._post(body, {op["id"] for op in request})

    async def _post(self, body: dict, asked: set[str]) -> list[str]:
        """One call: the ids the answer acks, checked (ValueError, or aiohttp's errors, when none came)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        async with self.http().post(self.url, json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
            if r.status != 200:
                raise ValueError(f"HTTP {r.status}")
            answer = await r.json(content_type=None)
        return self._validate(answer, asked)

    @staticmethod
    def _validate(answer: object, asked: set[str]) -> list[str]:
        if not isinstance(answer, dict) or not isinstance(answer.get("ack"), list):
            raise ValueError("the answer is not {\"ack\": [op id, ...]}")
        ack = answer["ack"]
        if not all(isinstance(i, str) for i in ack):
            raise ValueError("ack must list op ids (strings)")
        unknown = [i for i in ack if i not in asked]
        if unknown:
            raise ValueError(f"acked op id(s) it was not asked about: {', '.join(unknown[:5])}")
        return ack
