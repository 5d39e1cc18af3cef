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
