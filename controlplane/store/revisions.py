"""Each key's mod revision, as the region's view keeps them (RegionState.revs): what transaction
guards compare, and what the index's fresh read after an outage compares with etcd's (Index's
`revisions`).

A machine's revision is kept under its id, the one string its record and the view's machines dict
share, not under its whole key (`/twine/<region>/machines/<id>`): at a million machines, that key
was a string of about 80 bytes each, in every process (issue #38). A task's is kept under its
job's handle and its index (`/twine/<region>/tasks/<handle>/<index, 6 digits>`), a small dict a
job: its whole key was about 85 bytes a task more, in every process. Every other key is kept
whole. The mapping reads and iterates as whole keys either way.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from typing import Iterator

from controlplane.store.keys import INDEX_DIGITS, index_part

_MISSING = object()


class Revisions(MutableMapping):
    __slots__ = ("prefix", "machines", "tasks_prefix", "tasks", "_other")

    def __init__(self, machines_prefix: str, tasks_prefix: str | None = None):
        self.prefix = machines_prefix  # Keys.machines(): a key under it is a machine's
        # machine id -> its record's mod revision, read and written directly by the view with the
        # id string the machine's record holds (so that no second copy of it is kept)
        self.machines: dict[str, int] = {}
        self.tasks_prefix = tasks_prefix  # Keys.tasks(): a key under it is a task's (None: kept whole)
        self.tasks: dict[str, dict[int, int]] = {}  # job handle -> task index -> mod revision
        self._other: dict[str, int] = {}  # whole key -> mod revision, every other key

    def _task(self, key: str) -> tuple[str, int] | None:
        """(handle, index) of a task's key as Keys.task writes it (6 ASCII digits: one this mapping
        writes back the same); None for any other key, kept whole."""
        tp = self.tasks_prefix
        if tp is None or not key.startswith(tp):
            return None
        handle, _, idx = key[len(tp):].rpartition("/")
        if len(idx) == INDEX_DIGITS and handle and idx.isascii() and idx.isdigit():
            return handle, int(idx)
        return None

    def get(self, key: str, default: int | None = None) -> int | None:
        if key.startswith(self.prefix):
            return self.machines.get(key[len(self.prefix):], default)
        if (t := self._task(key)) is not None:
            d = self.tasks.get(t[0])
            return default if d is None else d.get(t[1], default)
        return self._other.get(key, default)

    def __getitem__(self, key: str) -> int:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __setitem__(self, key: str, revision: int) -> None:
        if key.startswith(self.prefix):
            self.machines[key[len(self.prefix):]] = revision
        elif (t := self._task(key)) is not None:
            d = self.tasks.get(t[0])
            if d is None:
                d = self.tasks[sys.intern(t[0])] = {}  # the handle the view's tasks dict has (interned)
            d[t[1]] = revision
        else:
            self._other[key] = revision

    def __delitem__(self, key: str) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: str, default=_MISSING):
        if key.startswith(self.prefix):
            d, k = self.machines, key[len(self.prefix):]
        elif (t := self._task(key)) is not None:
            by_index = self.tasks.get(t[0])
            v = _MISSING if by_index is None else by_index.pop(t[1], _MISSING)
            if by_index is not None and not by_index:
                del self.tasks[t[0]]  # a job's dict goes with its last task
            if v is _MISSING:
                if default is _MISSING:
                    raise KeyError(key)
                return default
            return v
        else:
            d, k = self._other, key
        return d.pop(k) if default is _MISSING else d.pop(k, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        yield from self._other
        for handle, by_index in self.tasks.items():  # whole keys one at a time, not all of them at once
            base = f"{self.tasks_prefix}{handle}/"
            for index in by_index:
                yield base + index_part(index)
        for mid in self.machines:
            yield self.prefix + mid

    def __len__(self) -> int:
        return len(self._other) + len(self.machines) + sum(map(len, self.tasks.values()))
