"""Up to when a health owner has heard its machines' heartbeats: the earliest of its own intake
horizon (daemon/intake.py: the last moment it had nothing unread and nothing to run) and those of
the members that relay it heartbeats (each says how far behind it was in its relays: broker/relay.py),
never more than a timeout before now. Silence is measured up to then (check.py): a heartbeat
waiting unread here, or at a member that would relay it, is not silence.

Waited for: the members whose record says they take and send `behind` (`intake`: those that hear
heartbeats) and that relayed this process a heartbeat in the last timeout. The others hear none of
its machines' (their agents heartbeat here: heartbeat_to), so a replica frozen, or busy as only a
scheduler is, delays no verdict. A member that left and came back (its lease lapsed: its loop was
held, most likely) is where it was when it left until it says otherwise; one whose relays stopped
for PEER_SILENT seconds is not waited for: what it hears does not reach this process anyway (a
partition between replicas, a wrong --advertise), and waiting would hold every verdict a timeout.
"""

from __future__ import annotations

import logging
import time
from math import inf
from typing import Any, Callable, Mapping

log = logging.getLogger("twine.controld.health")

PEER_SILENT = 3.0  # seconds without a relay from a member (relay.py's 2 s timeout and a beat)
PEER_KEPT = 600.0  # seconds a member gone is remembered, in case it comes back
STUCK = 1.0  # seconds behind past which a horizon is taken as stuck, not lagging by a relay or two


class HeardUpTo:
    def __init__(self) -> None:
        self.intake: Callable[[], float] = time.monotonic  # this process's horizon (Intake.horizon)
        # member -> [its horizon, when it last said it, joined or left, when it last relayed a
        # heartbeat here], in this process's clock
        self.peers: dict[str, list[float]] = {}
        self._present: set[str] = set()  # the members that say their horizon, at the last look
        self._silent: set[str] = set()  # those of them not waited for: no relay for PEER_SILENT s
        self.behind = 0.0  # how far before now the last answer was (seconds)
        self._said = ""  # whose intake held the last answer back, as last logged

    def peer(self, member: str, behind: float, relayed: bool) -> None:
        """A relay from `member`, which was `behind` seconds behind on its intake when it sent it:
        every heartbeat it heard before then has reached this process by now (`relayed`: this
        relay carried some)."""
        now = time.monotonic()
        last = self.peers.get(member)
        self.peers[member] = [now - behind, now, now if relayed else last[2] if last else -inf]

    def at(self, now: float, coordinator: Any, members: Mapping[str, dict], timeout: float) -> float:
        """The moment up to which silence is measured, now."""
        at, whose = self.intake(), "this process"
        if coordinator is not None:
            present = set()
            for member, rec in members.items():
                if member == coordinator.id or not rec.get("intake"):
                    continue
                present.add(member)
                peer = self.peers.get(member)
                if peer is None:
                    peer = self.peers[member] = [now, now, -inf]
                elif member not in self._present:  # back: waited for from now, where it was when it left
                    peer[0], peer[1] = min(peer[0], now), now
                if now - peer[2] > timeout:
                    continue  # it relays this process no heartbeat
                if now - peer[1] > PEER_SILENT:
                    if member not in self._silent:
                        self._silent.add(member)
                        log.warning("member %s has sent no relay for %.1fs: its intake is not waited for",
                                    member, now - peer[1])
                    continue
                self._silent.discard(member)
                if peer[0] < at:
                    at, whose = peer[0], f"member {member}"
            for gone in self._present - present:
                self.peers[gone][1] = now  # when it left
            for old in [m for m, (_, t, _) in self.peers.items() if m not in present and now - t > PEER_KEPT]:
                del self.peers[old]
            self._present = present
        behind = now - min(at, now)
        said = whose if behind > timeout / 2 else ""
        if said != self._said:
            if said:
                log.warning("intake %.1fs behind (%s): silence is measured up to then, %s", behind, said,
                            "for a timeout's doubt at most" if behind < timeout else
                            f"and no more than {timeout:g}s before now")
            else:
                log.info("intake caught up (%s)", self._said)
            self._said = said
        self.behind = min(behind, timeout)
        return now - self.behind
