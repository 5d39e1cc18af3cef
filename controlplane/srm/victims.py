"""Which tasks a scale-in stops: those whose removal empties machines first.

Tasks that are not running go first (they serve nothing); then the tasks on the machines that hold
the fewest of the entitlement's tasks, a machine's tasks together, so that a machine the job leaves
holds nothing of its entitlement and returns to the free pool. `avoid`: tasks not to choose (their
TaskController would not let them stop)."""

from __future__ import annotations

from typing import Iterable, Mapping

from controlplane.store.records import TaskRec


def choose(tasks: Mapping[int, TaskRec], live: Iterable[int], on_machine: Mapping[str, int], k: int,
           avoid: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """`tasks`: the job's task records; `live`: its task indices (JobRec.indices); `on_machine`:
    the entitlement's tasks on each machine. Returns up to k indices."""
    if k <= 0:
        return []

    def key(i: int) -> tuple:
        t = tasks.get(i)
        if t is None or t.machine is None or t.state not in ("running", "starting"):
            return (0, 0, "", -i)
        return (1, on_machine.get(t.machine, 0), t.machine, -i)

    return sorted((i for i in live if i not in avoid), key=key)[:k]
