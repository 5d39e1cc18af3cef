"""The machine index: healthy machines in buckets by (machine type, owner) and by bin, each bucket
ordered by free resources (best fit first).

Why this shape: a request names one machine type and one entitlement, so it reads two groups
(the entitlement's machines and the free pool of that type) and never looks at other types or
other entitlements. Within a group, a bin (an msb, or a rack) is one sorted tuple; a bisect on free
cpus skips every machine too small, so finding the best-fitting machine in a bin costs a bisect and
usually one comparison. A job of 36 tasks spread over msbs touches a few dozen bins, not 100,000
machines. The index is immutable; `updated` copies only the buckets a change touches.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping

from .model import EPSILON, Machine

# Bins the index keeps. A preference on "region" or "dc" is scored over msb bins (an msb lies
# in exactly one dc), so only these two are needed.
INDEXED_LEVELS = ("msb", "rack")

Entry = tuple[float, int, str]  # (free cpus, free memory_mb, machine id): ascending = best fit
GroupKey = tuple[str, str | None]  # (machine type, entitlement; None = the free pool)
Path = tuple[str, ...]
Bucket = tuple[Entry, ...]
FreeOf = Callable[[str], tuple[float, int]]


class MachineIndex:
    __slots__ = ("_buckets", "_entries", "_held")

    def __init__(self, buckets: dict, entries: dict[str, Entry], held: dict[str, int]) -> None:
        self._buckets = buckets  # level -> GroupKey -> Path -> Bucket
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
            for level in INDEXED_LEVELS:
                lists[level].setdefault(group, {}).setdefault(m.path(level), []).append(e)
        buckets = {
            level: {g: {p: tuple(sorted(b)) for p, b in bins.items()} for g, bins in groups.items()}
            for level, groups in lists.items()
        }
        return cls(buckets, entries, held)

    def bins(self, level: str, machine_type: str, owner: str | None) -> Mapping[Path, Bucket]:
        return self._buckets[level].get((machine_type, owner), {})

    def held(self, entitlement: str) -> int:
        return self._held.get(entitlement, 0)

    def updated(self, changes: Iterable[tuple[Machine | None, Machine | None]], free_of: FreeOf) -> MachineIndex:
        """A new index with each (old, new) machine replaced; None means absent. Copy-on-write:
        only the touched buckets and the dicts above them are copied."""
        entries = dict(self._entries)
        held = dict(self._held)
        edits: dict[tuple[str, GroupKey, Path], list[Entry]] = {}

        def bucket(level: str, group: GroupKey, path: Path) -> list[Entry]:
            key = (level, group, path)
            if key not in edits:
                edits[key] = list(self._buckets[level].get(group, {}).get(path, ()))
            return edits[key]

        for old, new in changes:
            if old is not None:
                if old.entitlement is not None:
                    held[old.entitlement] -= 1
                e = entries.pop(old.id, None)
                if e is not None:
                    for level in INDEXED_LEVELS:
                        b = bucket(level, (old.machine_type, old.entitlement), old.path(level))
                        i = bisect_left(b, e)
                        assert i < len(b) and b[i] == e, f"index out of step for machine {old.id}"
                        del b[i]
            if new is not None:
                if new.entitlement is not None:
                    held[new.entitlement] = held.get(new.entitlement, 0) + 1
                if new.schedulable:
                    e = entries[new.id] = (*free_of(new.id), new.id)
                    for level in INDEXED_LEVELS:
                        insort(bucket(level, (new.machine_type, new.entitlement), new.path(level)), e)

        buckets = {level: dict(groups) for level, groups in self._buckets.items()}  # a few hundred groups
        copied: set[tuple[str, GroupKey]] = set()
        for (level, group, path), b in edits.items():
            if (level, group) not in copied:
                copied.add((level, group))
                buckets[level][group] = dict(buckets[level].get(group, {}))
            bins = buckets[level][group]
            if b:
                bins[path] = tuple(b)
            else:
                bins.pop(path, None)  # an empty bin is no candidate
                if not bins:
                    del buckets[level][group]
        return MachineIndex(buckets, entries, {k: v for k, v in held.items() if v})


def first_fit(bucket: Bucket, cpus: float, memory_mb: int, skip: Mapping | set = frozenset()) -> Entry | None:
    """The best-fitting entry with room for one task, ignoring machine ids in `skip` (machines
    this allocation already touched: their free resources in the bucket are out of date)."""
    for i in range(bisect_left(bucket, (cpus - EPSILON,)), len(bucket)):
        e = bucket[i]
        if e[1] >= memory_mb and e[2] not in skip:
            return e
    return None
