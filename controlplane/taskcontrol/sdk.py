"""The TaskController SDK: write a class with one method, serve it over HTTP, and Twine's scheduler
asks it before any disruptive operation on the job's tasks (paper Figure 8).

    from controlplane.taskcontrol.sdk import TaskController, run

    class OneAtATime(TaskController):
        def decide(self, request):
            if self.in_flight or request.unhealthy:
                return []                       # wait: something is already down
            return [request.ops[0]] if request.ops else []

    run(OneAtATime(), "127.0.0.1", 9090)        # the job's spec: controller: http://127.0.0.1:9090/

The SDK does the bookkeeping: `self.in_flight` holds the operations this controller approved that
the scheduler has not reported completed yet (an approval the scheduler did not act on comes back
in `request.ops` and leaves `in_flight`); `self.completed` counts what finished; sequence numbers
are checked (an old call is answered with no acks); `self.calls` keeps a short history.

Dry runs (`twinectl job update --dry-run`, maintenance and rebalance dry runs): a call marked
`dryRun: true` asks what the controller would ack. The SDK answers it exactly as a real call, with
the same `decide`, which sees a copy of `self.in_flight` that the dry run's own calls move forward
(by their `dryRunId`, until the call marked `dryRunEnd`); nothing of the real bookkeeping changes,
so `decide` needs no code for dry runs. Such calls are in `self.calls` with `"dryRun": True`.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from aiohttp import web

log = logging.getLogger("twine.taskcontrol.sdk")


@dataclass(frozen=True)
class Operation:
    id: str
    job: str
    index: int
    machine: str | None
    kind: str  # restart, move, stop
    reason: str  # update, machine failure, maintenance, rebalance, resize

    @classmethod
    def from_json(cls, d: dict) -> Operation:
        t = d.get("task") or {}
        return cls(str(d["id"]), str(t.get("job", "")), int(t.get("index", -1)), t.get("machine"),
                   str(d.get("kind", "")), str(d.get("reason", "")))


@dataclass(frozen=True)
class Notice:
    id: str
    machines: tuple[str, ...]
    start: float
    deadline: float
    duration: float | None
    tasks: tuple[int, ...]  # this job's task indices on those machines
    raw: dict = field(default_factory=dict, compare=False)
    phase: str = "scheduled"  # scheduled (before the deadline), in progress (its tasks are stopped)
    end: float | None = None  # when the machines are back
    reason: str = ""
    kind: str = "maintenance"  # or reclaim: the machines leave the job's opportunistic entitlement

    @classmethod
    def from_json(cls, d: dict) -> Notice:
        return cls(str(d.get("id")), tuple(d.get("machines", ())), float(d.get("start", 0)),
                   float(d.get("deadline", 0)), d.get("duration"), tuple(d.get("tasks", ())), d,
                   str(d.get("phase", "scheduled")), d.get("end"), str(d.get("reason", "")),
                   str(d.get("kind", "maintenance")))


@dataclass(frozen=True)
class UnhealthyTask:
    job: str
    index: int
    machine: str | None
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Request:
    job: str
    ops: tuple[Operation, ...]  # pending operations to approve (or not, for now)
    completed: tuple[Operation, ...]
    notices: tuple[Notice, ...]
    unhealthy: tuple[UnhealthyTask, ...]
    sequence: int

    def unhealthy_indices(self) -> set[int]:
        return {u.index for u in self.unhealthy}


def parse_request(body: object) -> Request:
    if not isinstance(body, dict):
        raise ValueError("the request is not a JSON object")
    return Request(
        job=str(body.get("jobHandle", "")),
        ops=tuple(Operation.from_json(o) for o in body.get("request", [])),
        completed=tuple(Operation.from_json(o) for o in body.get("completed", [])),
        notices=tuple(Notice.from_json(n) for n in body.get("advanceNotices", [])),
        unhealthy=tuple(UnhealthyTask(str(u.get("job", "")), int(u.get("index", -1)), u.get("machine"),
                                      str(u.get("state", "")), str(u.get("reason", "")))
                        for u in body.get("allUnhealthyTasks", [])),
        sequence=int(body.get("sequenceNumber", 0)),
    )


class TaskController:
    """Subclass and implement `decide`."""

    def __init__(self) -> None:
        self.in_flight: dict[str, Operation] = {}
        self.completed = 0
        self.last_sequence = -1
        self.calls: deque[dict] = deque(maxlen=1000)
        self._lock = threading.Lock()
        self._dry: dict[str, dict[str, Operation]] = {}  # a dry run's operations in flight, by its dryRunId
        self._last_logged: tuple = ()  # the last decision its log said

    def decide(self, request: Request) -> Iterable[str | Operation]:
        """Which of `request.ops` may proceed now (any subset, any order)."""
        raise NotImplementedError

    def process(self, body: object) -> dict:
        """One call of the TaskControl protocol: bookkeeping, then `decide`. A dry run's call
        (`dryRun: true`: what would you ack?) is answered exactly as a real one, by the same
        `decide`, from a copy of this controller's operations in flight that the dry run's own
        calls move forward (keyed by its `dryRunId`); nothing of the real bookkeeping changes."""
        if isinstance(body, dict) and body.get("dryRun"):
            return self._dry_run(body)
        request = parse_request(body)
        with self._lock:
            # completions are facts, whatever the call's age: a stale call's are taken too (the
            # scheduler sends each once, or again after a change of leader that came before the
            # answer: one not in flight here is nothing; dropped here, its op would stay in flight)
            for op in request.completed:  # done, or cancelled before it ran
                if self.in_flight.pop(op.id, None) is not None:
                    self.completed += 1
            if request.sequence <= self.last_sequence:
                log.warning("%s: stale call %d (last %d): no acks", request.job, request.sequence, self.last_sequence)
                return {"ack": []}
            self.last_sequence = request.sequence
            for op in request.ops:  # asked again: the scheduler did not act on our approval
                self.in_flight.pop(op.id, None)
            asked = {op.id: op for op in request.ops}
            acks = []
            for choice in self.decide(request):
                op_id = choice.id if isinstance(choice, Operation) else str(choice)
                if op_id in asked and op_id not in acks:
                    acks.append(op_id)
                    self.in_flight[op_id] = asked[op_id]
            self.calls.append({"sequence": request.sequence, "request": sorted(asked), "ack": list(acks),
                               "completed": [op.id for op in request.completed],
                               "unhealthy": sorted(request.unhealthy_indices()),
                               "notices": [n.id for n in request.notices]})
            decided = (request.job, tuple(sorted(asked)), tuple(acks))
            if request.completed or (asked and decided != self._last_logged):  # its log says what it decided,
                self._last_logged = decided  # once: an op it holds back is asked again at every call
                log.info("%s: call %d: asked %s; acked %s; completed %s; unhealthy %s", request.job,
                         request.sequence, sorted(asked) or "-", acks or "-",
                         [op.id for op in request.completed] or "-", sorted(request.unhealthy_indices()) or "-")
            return {"ack": acks}

    def _dry_run(self, body: dict) -> dict:
        request = parse_request(body)
        run_id = str(body.get("dryRunId", ""))
        with self._lock:
            shadow = self._dry.pop(run_id, None)
            if shadow is None:
                shadow = dict(self.in_flight)  # from where the real controller stands now
            for op in request.completed:
                shadow.pop(op.id, None)
            for op in request.ops:
                shadow.pop(op.id, None)
            asked = {op.id: op for op in request.ops}
            real = self.in_flight
            self.in_flight = shadow  # decide() reads self.in_flight: the dry run's, for this call
            try:
                choices = list(self.decide(request))
            finally:
                self.in_flight = real
            acks = []
            for choice in choices:
                op_id = choice.id if isinstance(choice, Operation) else str(choice)
                if op_id in asked and op_id not in acks:
                    acks.append(op_id)
                    shadow[op_id] = asked[op_id]
            if not body.get("dryRunEnd"):
                self._dry[run_id] = shadow
                while len(self._dry) > 16:  # dry runs that never ended
                    self._dry.pop(next(iter(self._dry)))
            self.calls.append({"sequence": request.sequence, "request": sorted(asked), "ack": list(acks),
                               "completed": [op.id for op in request.completed],
                               "unhealthy": sorted(request.unhealthy_indices()),
                               "notices": [n.id for n in request.notices], "dryRun": True})
            return {"ack": acks}

    def app(self, token: str | None = None) -> web.Application:
        """The controller's HTTP endpoint. With `token` (the job's controller_token), a call
        without `Authorization: Bearer <token>` is a 401 and reaches no decision."""
        expected = f"Bearer {token}".encode() if token else None

        async def handle(request: web.Request) -> web.Response:
            given = request.headers.get("Authorization", "").encode(errors="surrogateescape")
            if expected is not None and not hmac.compare_digest(given, expected):
                return web.json_response({"error": "unauthorized: not the job's controller_token"}, status=401)
            try:
                body = await request.json()
                return web.json_response(self.process(body))
            except (ValueError, TypeError, KeyError) as e:
                return web.json_response({"error": str(e)}, status=400)

        app = web.Application()
        app.router.add_post("/", handle)
        return app


async def serve(controller: TaskController, host: str, port: int, token: str | None = None) -> web.AppRunner:
    runner = web.AppRunner(controller.app(token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def run(controller: TaskController, host: str, port: int, token: str | None = None) -> None:
    """Serve until interrupted (the body of a controller program's main). `token`: the job's
    controller_token, which every call must carry."""

    async def main() -> None:
        runner = await serve(controller, host, port, token)
        log.info("TaskController %s on http://%s:%d/", type(controller).__name__, host, port)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


def token_file(parser: argparse.ArgumentParser, path: Path | None) -> str | None:
    """A controller program's --token-file: its first line, the job's controller_token."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        parser.error(f"--token-file {path}: {getattr(e, 'strerror', None) or e}")
    token = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not token:
        parser.error(f"--token-file {path}: holds no token")
    return token


class Background:
    """A controller served from a thread of its own (for tests and embedding):
    `with Background(controller) as url: ...`."""

    def __init__(self, controller: TaskController, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        self.controller, self.host, self.port, self.token = controller, host, port, token
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(serve(self.controller, self.host, self.port, self.token), self._loop)
        self._runner = fut.result(10)
        sockets = [s for site in self._runner.sites for s in site._server.sockets]  # noqa: SLF001
        self.port = sockets[0].getsockname()[1]
        return f"http://{self.host}:{self.port}/"

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
