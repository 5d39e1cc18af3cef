"""The machine index: healthy machines in buckets by (machine type, owner) and by bin, each bucket
ordered by free resources (best fit first).

Why this shape: a request names one machine type and one entitlement, so it reads two groups
(the entitlement's machines and the free pool of that type) and never looks at other types or
other entitlements. Within a group, a bin (an msb, or a rack) is one sorted tuple; a bisect on free
cpus skips every machine too small, so finding the best-fitting machine in a bin costs a bisect and
usually one comparison. A job of 36 tasks spread over msbs touches a few dozen bins, not 100,000
machines.

The index is updated in place (`update`): a changed machine costs a bisect, a delete and an insort
in each of its two bins, whatever the size of the region. Its owner (the snapshot) is the only
writer and nobody reads it during an update: allocations are synchronous.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence

from .errors import AllocatorInconsistency
from .model import EPSILON, Machine

# Bins the index keeps. A preference on "region" or "dc" is scored over msb bins (an msb lies
# in exactly one dc), so only these two are needed.
INDEXED_LEVELS = ("msb", "rack")

Entry = tuple[float, int, str]  # (free cpus, free memory_mb, machine id): ascending = best fit
GroupKey = tuple[str, str | None]  # (machine type, entitlement; None = the free pool)
Path = tuple[str, ...]
Bucket = Sequence[Entry]  # sorted; a list the index owns (readers do not change it)
FreeOf = Callable[[str], tuple[float, int]]


class MachineIndex:
    __slots__ = ("_buckets", "_entries", "_held")

    def __init__(self, buckets: dict, entries: dict[str, Entry], held: dict[str, int]) -> None:
        self._buckets = buckets  # level -> GroupKey -> Path -> sorted list of entries (never empty)
        self._entries = entries  # machine id -> its Entry, for healthy machines
        self._held = held  # entitlement -> machines it holds (healthy or not)

    @classmethod
    def build(cls, machines: Iterable[Machine], free_of: FreeOf) -> MachineIndex:
        lists: dict = {level: {} for level in INDEXED_LEVELS}
        entries: dict[str, Entry] = {}
        held: dict[str, int] = {}
        for m in machines:
            if m.entitlement is not None:
                held[m.entitlement] = held.get(m.entitlement, 0) + 1
            if not m.schedulable:
                continue
            e = entries[m.id] = (*free_of(m.id), m.id)
            group = (m.machine_type, m.entitlement)
            for level, path in _paths(m):
                lists[level].setdefault(group, {}).setdefault(path, []).append(e)
        for groups in lists.values():
            for bins in groups.values():
                for b in bins.values():
                    b.sort()
        return cls(lists, entries, held)

    def copy(self) -> MachineIndex:
        """An independent copy (costs the region: for tests and what-if simulations)."""
        buckets = {level: {g: {p: list(b) for p, b in bins.items()} for g, bins in groups.items()}
                   for level, groups in self._buckets.items()}
        return MachineIndex(buckets, dict(self._entries), dict(self._held))

    def bins(self, level: str, machine_type: str, owner: str | None) -> Mapping[Path, Bucket]:
        return self._buckets[level].get((machine_type, owner), {})

    def held(self, entitlement: str) -> int:
        return self._held.get(entitlement, 0)

    def update(self, changes: Iterable[tuple[Machine | None, Machine | None]], free_of: FreeOf) -> None:
        """Replace each (old, new) machine in place; None means absent. `free_of` gives a machine's
        free resources after the change; the old entry is the one stored, so the order in which
        the caller changed resources and machines does not matter. One pair per machine."""
        entries, held = self._entries, self._held
        for old, new in changes:
            e_old = e_new = None
            if old is not None:
                if old.entitlement is not None:
                    n = held[old.entitlement] - 1
                    if n:
                        held[old.entitlement] = n
                    else:
                        del held[old.entitlement]
                e_old = entries.pop(old.id, None)
            if new is not None:
                if new.entitlement is not None:
                    held[new.entitlement] = held.get(new.entitlement, 0) + 1
                if new.schedulable:
                    e_new = entries[new.id] = (*free_of(new.id), new.id)
            if e_old is not None and e_new is not None and _same_bins(old, new):
                self._move(old, e_old, e_new)  # the common case: its free resources changed
                continue
            if e_old is not None:
                for level, path in _paths(old):
                    self._remove(level, (old.machine_type, old.entitlement), path, e_old, old.id)
            if e_new is not None:
                for level, path in _paths(new):
                    insort(self._buckets[level].setdefault((new.machine_type, new.entitlement), {})
                           .setdefault(path, []), e_new)

    def _move(self, m: Machine, old: Entry, new: Entry) -> None:
        """A machine's entry changed within the same bins."""
        group = (m.machine_type, m.entitlement)
        for level, path in _paths(m):
            b = self._buckets[level].get(group, {}).get(path, [])
            del b[_position(b, old, m.id, level, path)]
            insort(b, new)

    def _remove(self, level: str, group: GroupKey, path: Path, e: Entry, machine_id: str) -> None:
        bins = self._buckets[level].get(group, {})
        b = bins.get(path, [])
        del b[_position(b, e, machine_id, level, path)]
        if not b:
            del bins[path]  # an empty bin is no candidate
            if not bins:
                del self._buckets[level][group]


def _position(b: Bucket, e: Entry, machine_id: str, level: str, path: Path) -> int:
    """Where the machine's stored entry is in its bin. Missing: the index is out of step with the
    machines it indexes, a bug."""
    i = bisect_left(b, e)
    if i < len(b) and b[i] == e:
        return i
    raise AllocatorInconsistency(f"the allocator's index is out of step with machine {machine_id}: its entry "
                                 f"(free cpus {e[0]:g}, memory {e[1]} MB) is not in its {level} bin {'/'.join(path)}")


def _paths(m: Machine) -> tuple[tuple[str, Path], tuple[str, Path]]:
    """The machine's bin at each indexed level (INDEXED_LEVELS: msb, rack)."""
    rack = (m.region, m.dc, m.msb, m.rack)
    return ("msb", rack[:3]), ("rack", rack)


def _same_bins(a: Machine, b: Machine) -> bool:
    return (a.machine_type == b.machine_type and a.entitlement == b.entitlement and a.rack == b.rack
            and a.msb == b.msb and a.dc == b.dc and a.region == b.region)


def first_fit(bucket: Bucket, cpus: float, memory_mb: int, skip: Mapping | set = frozenset()) -> Entry | None:
    """The best-fitting entry with room for one task, ignoring machine ids in `skip` (machines
    this allocation already touched: their free resources in the bucket are out of date)."""
    for i in range(bisect_left(bucket, (cpus - EPSILON,)), len(bucket)):
        e = bucket[i]
        if e[1] >= memory_mb and e[2] not in skip:
            return e
    return None
