"""How far what reached this process has been heard: its intake horizon.

The health check fails a machine whose heartbeats stopped. But a process behind on its intake (its
loop held, or busy with more requests than it can take) has heartbeats waiting unread in its
sockets: measured up to now, their machines look silent and are failed while they heartbeat
(bench_region_scale counted thousands of such verdicts at 100,000 machines on two cores). So the
health check measures silence up to the horizon instead: the last moment up to which every
request that reached this process has been handled.

The event loop says when that is. It polls its sockets (the selector's `select`) with no wait while
it has callbacks ready to run, and with a wait only once it has run them all. There, a poll without
waiting comes first: if it finds nothing unread either, everything that came until now has been
read and handled, and the horizon is now; if the wait then ends with nothing found, the horizon is
its end. A process that never runs out of work, or always finds more unread when it does, does not
move its horizon: it judges by what it had heard, as it cannot tell a silent agent from an unread
one. (Not seen: a request held by a handler that awaits something, with the next ones of its
connection behind it; an agent sends one heartbeat at a time, and its handler awaits no other.)
"""

from __future__ import annotations

import asyncio
import selectors
import time


class Intake:
    """The horizon of one process's event loop, from the selector it makes (`loop()`). Without it
    (a loop made elsewhere, as in tests of the parts) the horizon is now: nothing is said to wait."""

    def __init__(self) -> None:
        self.caught_up = time.monotonic()
        self.measured = False

    def horizon(self) -> float:
        """Monotonic time before which everything that reached this process's sockets was handled."""
        return self.caught_up if self.measured else time.monotonic()

    def behind(self) -> float:
        """Seconds from the horizon to now."""
        return max(0.0, time.monotonic() - self.horizon())

    def loop(self) -> asyncio.AbstractEventLoop:
        """An event loop whose polls move this horizon (asyncio.Runner's loop_factory)."""
        intake = self
        base: type[selectors.BaseSelector] = selectors.DefaultSelector

        class Measured(base):  # type: ignore[misc, valid-type]
            def select(self, timeout=None):
                if timeout is not None and timeout <= 0:  # callbacks ready to run
                    return super().select(timeout)
                ready = super().select(0)
                if ready:
                    return ready
                intake.caught_up = time.monotonic()  # nothing to run, nothing unread: all heard until now
                ready = super().select(timeout)
                if not ready:  # and nothing came while it waited
                    intake.caught_up = time.monotonic()
                return ready

        self.measured = True
        self.caught_up = time.monotonic()
        return asyncio.SelectorEventLoop(Measured())
