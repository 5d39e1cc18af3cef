"""How the scheduler sees a machine in maintenance (Scheduler.machine_status), including a machine still down
when its maintenance ends, which has a grace to come back."""

from __future__ import annotations

import time

from controlplane.store.records import EventRec, MachineRec
from controlplane.opsplanner.notices import MAINTENANCE_GRACE
from controlplane.scheduler.service import Scheduler
from controlplane.store.state import RegionState
from controlplane.store.keys import Keys


def scheduler(machine: MachineRec, event: EventRec) -> Scheduler:
    keys = Keys("r")
    state = RegionState(None, keys)  # fed by hand: no store is touched by view()
    state.machines[machine.id] = machine
    state._apply(keys.event(event.id), event.to_json(), 1)  # noqa: SLF001 - the watch's own path
    return Scheduler(state, None, keys, reports=lambda mid: {})


def test_view_phases_and_the_grace_for_a_machine_still_silent_after_its_maintenance():
    now = time.time()
    m = MachineRec("m1", "m1", {}, {})
    e = EventRec("maint-1", "maintenance", ("m1",), now + 100, duration=60.0, deadline=now + 50)
    s = scheduler(m, e)
    assert s.machine_status("m1", now).maintenance.active is False
    assert s.machine_status("m1", now + 50).maintenance.active is True
    assert s.machine_status("m1", now + 160).maintenance is None, "over, and the machine is healthy"
    silent = MachineRec("m1", "m1", {}, {}, healthy=False, health_reason="no heartbeat for 5.0s")
    s = scheduler(silent, e)
    graced = s.machine_status("m1", now + 160).maintenance
    assert graced.active and graced.until == now + 160 + MAINTENANCE_GRACE
    assert s.machine_status("m1", now + 161 + MAINTENANCE_GRACE).maintenance is None, "then it is an ordinary failure"


def test_a_maintenance_ended_early_gives_the_same_grace_from_its_end():
    from dataclasses import replace

    now = time.time()
    e = EventRec("maint-1", "maintenance", ("m1",), now - 10, duration=3600.0, deadline=now - 20, end=now - 5)
    s = scheduler(MachineRec("m1", "m1", {}, {}, healthy=False, health_reason="no heartbeat for 9.0s"), e)
    assert s.machine_status("m1", now).maintenance.until == now - 5 + MAINTENANCE_GRACE
    s = scheduler(MachineRec("m1", "m1", {}, {}), replace(e))
    assert s.machine_status("m1", now).maintenance is None, "a healthy machine is simply back"
