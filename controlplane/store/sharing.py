"""One object for what many records in the region's view have alike (issue #38): at a million
machines, and many tasks on each, a copy a record of the same dict or string was most of what the
view held. Records are replaced, never changed in place, so a shared value is never changed under
another record's feet."""

from __future__ import annotations

from controlplane.store.records import TASK_STATES, MachineRec, TaskRec

ALIKE = 10_000  # distinct strings and numbers shared among machine records at most (a health reason with a time in it is not)
_STATES = {s: s for s in TASK_STATES}  # a task's state as one string each, not one a record


class Shared:
    __slots__ = ("parts", "alike")

    def __init__(self) -> None:
        self.parts: dict[tuple, dict] = {}  # machine labels and capacities, one of each
        self.alike: dict = {}  # strings and numbers machines share, one of each (at most ALIKE)

    def machine(self, m: MachineRec, old: MachineRec | None = None) -> None:
        """The machine's labels and capacity as one dict per distinct value (a rack's machines
        share their labels; a machine type's its capacity): at a million machines, one dict each
        was about half of what a machine's record held in memory. And the strings and numbers many
        machines have alike as one object each (a health reason, a profile's hash, an agent's
        version, 0.0), a hostname that is the machine's id as the id itself: 170 bytes a machine of
        550 where most are down alike. `old`, the record it replaces: what is as it was there is
        taken from it, compared and not hashed (most rewrites of a machine change a field or two: its
        health, its agent's profile report)."""
        for name in ("labels", "capacity"):
            d = getattr(m, name)
            if old is not None and (was := getattr(old, name)) == d:
                object.__setattr__(m, name, was)
                continue
            try:
                shared = self.parts.setdefault((name, *d.items()), d)
            except (TypeError, AttributeError):  # not a dict of plain values: kept as it is
                continue
            if shared is not d:
                object.__setattr__(m, name, shared)
        if m.hostname == m.id and m.hostname is not m.id:
            object.__setattr__(m, "hostname", m.id)
        alike = self.alike
        for name in ("health_reason", "profile_applied", "profile_hash", "agent_version"):
            v = getattr(m, name)
            if old is not None and type(was := getattr(old, name)) is type(v) and was == v:
                object.__setattr__(m, name, was)
            elif type(v) in (str, float, int):  # (a record of another shape keeps what it has)
                # keyed by type too: 8 and 8.0 are one key of a dict, and a record's float stays a float
                object.__setattr__(m, name, alike.setdefault((type(v), v), v) if len(alike) < ALIKE else v)


def share_task(t: TaskRec, handle: str, machines: dict[str, MachineRec]) -> None:
    """A fresh task record's strings as the ones the view has already: its job's handle (the view's,
    interned), its machine's id (the machine record's), its state: 170 of the 320 bytes a decoded
    task held, in every process."""
    if t.job == handle and t.job is not handle:
        object.__setattr__(t, "job", handle)
    if t.machine is not None and (m := machines.get(t.machine)) is not None and t.machine is not m.id:
        object.__setattr__(t, "machine", m.id)
    if (state := _STATES.get(t.state)) is not None and state is not t.state:
        object.__setattr__(t, "state", state)
