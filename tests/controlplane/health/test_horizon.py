"""Up to when a health owner has heard its machines' heartbeats (controlplane/health/horizon.py):
its own intake horizon and the members' that relay it heartbeats, a timeout back at most."""

from __future__ import annotations

import time
from types import SimpleNamespace

from controlplane.health import horizon
from controlplane.health.horizon import HeardUpTo

TIMEOUT = 5.0


def test_the_horizon_is_the_earliest_of_this_process_and_the_members_that_relay_it_heartbeats():
    """A heartbeat that reached another member is relayed once that member has read it: a member
    behind on its intake holds back verdicts here too. Members that do not say their horizon (a
    version before it, or no heartbeat role) are not waited for, nor one that relays no heartbeat
    here, nor one whose relays stopped (what it hears does not come here anyway); one that left
    and came back is where it was until it says otherwise."""
    members = {"a": {"intake": True}, "b": {"intake": True}, "c": {}}
    me = SimpleNamespace(id="a")
    heard = HeardUpTo()

    def at() -> tuple[float, float]:
        now = time.monotonic()
        return heard.at(now, me, members, TIMEOUT), now

    h, now = at()
    assert h == now, "b seen joining now; c never says its horizon"
    heard.peer("b", 3.0, relayed=False)
    h, now = at()
    assert h == now, "b relays no heartbeat here: none of ours waits there"
    heard.peer("b", 3.0, relayed=True)
    h, now = at()
    assert abs(h - (now - 3.0)) < 0.05 and 2.95 < heard.behind < 3.05
    heard.intake = lambda: time.monotonic() - 4.0  # this process further behind
    h, now = at()
    assert h <= now - 3.99
    heard.intake = time.monotonic
    heard.peer("b", 60.0, relayed=False)  # (it relayed one within the timeout)
    h, now = at()
    assert h == now - TIMEOUT and heard.behind == TIMEOUT, "never more than a timeout back"
    heard.peers["b"][1] -= horizon.PEER_SILENT + 0.1  # its last relay that long ago
    h, now = at()
    assert h == now, "b's relays stopped: not waited for"
    heard.peer("b", 2.0, relayed=True)
    h, now = at()
    assert h <= now - 2.0
    del members["b"]  # b's key gone
    h, now = at()
    assert h == now
    members["b"] = {"intake": True}
    h, now = at()
    assert h <= now - 2.0, "back: behind where it was when it left"
    heard.peer("b", 2.0, relayed=False)
    heard.peers["b"][2] -= TIMEOUT + 0.1  # its last heartbeat relayed here more than a timeout ago
    h, now = at()
    assert h == now, "no heartbeat relayed for a timeout: not waited for"


def test_without_replicas_the_horizon_is_this_process_alone():
    heard = HeardUpTo()
    heard.intake = lambda: time.monotonic() - 1.5
    now = time.monotonic()
    assert now - 1.6 < heard.at(now, None, {}, TIMEOUT) <= now - 1.49
