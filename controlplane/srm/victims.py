"""Which tasks a scale-in stops: those whose removal empties machines first.

Tasks that are not running go first (they serve nothing); then the tasks on the machines that hold
the fewest of the entitlement's tasks, a machine's tasks together, so that a machine the job leaves
holds nothing of its entitlement and returns to the free pool. `avoid`: tasks not to choose (their
TaskController would not let them stop). frees(): the sizes at which stopping in that order
empties a machine, for a scale-in that stops whole machines' worth (recommend.py)."""

from __future__ import annotations

from collections import Counter
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


def frees(tasks: Mapping[int, TaskRec], live: Iterable[int], on_machine: Mapping[str, int],
          avoid: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """The job's sizes, largest first, at which stopping its tasks in choose()'s order has emptied
    one machine more: a machine counts once the last of the job's tasks on it stops and it then holds
    none of the entitlement's (`on_machine`: the entitlement's tasks on each machine). Empty when
    no scale-in of this job alone can hand a machine back (it shares each with other jobs). The
    same walk as choose()'s, a machine at a time (no sort of every task: the SRM asks this each
    interval a scale-in waits for a machine)."""
    live = list(live)
    stopped = 0  # choose() stops the tasks that do not run first: they empty no machine
    mine: Counter[str] = Counter()
    kept: Counter[str] = Counter()  # tasks in `avoid`: their machine never empties
    for i in live:
        t = tasks.get(i)
        if t is None or t.machine is None or t.state not in ("running", "starting"):
            stopped += i not in avoid
            continue
        mine[t.machine] += 1
        if i in avoid:
            kept[t.machine] += 1
    out = []
    for m in sorted(mine, key=lambda m: (on_machine.get(m, 0), m)):
        stopped += mine[m] - kept[m]
        if not kept[m] and on_machine.get(m, 0) == mine[m]:
            out.append(len(live) - stopped)
    return out
