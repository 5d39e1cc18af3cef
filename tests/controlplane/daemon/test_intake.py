"""The intake horizon (controlplane/daemon/intake.py) on a real event loop and a real loopback
socket: what reached the process while its loop was held, or while it never ran out of work, is
behind the horizon until it has been handled."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from controlplane.daemon.intake import Intake


def run(intake: Intake, coro) -> object:
    with asyncio.Runner(loop_factory=intake.loop) as runner:
        return runner.run(coro)


def test_a_request_that_came_while_the_loop_was_held_is_behind_the_horizon_until_handled():
    intake = Intake()

    async def body() -> None:
        handled = asyncio.Event()
        at: dict[str, float] = {}

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(9)
            at["handled"] = time.monotonic()
            at["horizon when handled"] = intake.horizon()
            handled.set()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        try:
            await asyncio.sleep(0.1)  # the connection accepted, the loop idle: the horizon is now
            assert time.monotonic() - intake.horizon() < 0.1
            sent = threading.Event()

            def send_later() -> None:
                time.sleep(0.2)
                at["sent"] = time.monotonic()
                client.sendall(b"heartbeat")
                sent.set()

            threading.Thread(target=send_later).start()
            held = time.monotonic()
            time.sleep(1.0)  # the loop held: the request waits unread in the socket
            assert sent.is_set()
            assert intake.horizon() <= held < at["sent"], "what came while held is not heard yet"
            assert intake.behind() >= 1.0
            await asyncio.wait_for(handled.wait(), 5)
            # the poll that found it moved nothing: it was unread then
            assert at["horizon when handled"] <= held, (at, held)
            await asyncio.sleep(0.05)  # idle again: everything that came has been handled
            assert intake.horizon() > at["sent"]
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    run(intake, body())


def test_a_loop_that_never_runs_out_of_work_keeps_its_horizon_where_it_last_had_none():
    intake = Intake()

    async def body() -> None:
        await asyncio.sleep(0.05)
        start = time.monotonic()
        while time.monotonic() - start < 0.4:  # a callback always ready: every poll waits for nothing
            await asyncio.sleep(0)
        assert intake.horizon() <= start, "busy all along: nothing after its start is known heard"
        await asyncio.sleep(0.05)
        assert intake.horizon() >= start + 0.4

    run(intake, body())
