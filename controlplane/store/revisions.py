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

    def _place(self, key: str) -> tuple[dict, str | int]:
        if key.startswith(self.prefix):
            return self.machines, key[len(self.prefix):]
        tp = self.tasks_prefix
        if tp is not None and key.startswith(tp):
            handle, _, idx = key[len(tp):].rpartition("/")
            # only a key this mapping writes back the same (Keys.task: 6 digits); any other stays whole
            if len(idx) == 6 and idx.isdigit() and handle:
                return self.tasks.setdefault(sys.intern(handle), {}), int(idx)
        return self._other, key

    def _gone(self, d: dict, key: str) -> None:
        """A job's dict emptied by a task's removal goes too."""
        if d is not self._other and d is not self.machines and not d:
            handle = key[len(self.tasks_prefix):].rpartition("/")[0]
            if self.tasks.get(handle) is d:
                del self.tasks[handle]

    def get(self, key: str, default: int | None = None) -> int | None:
        if self.tasks_prefix is not None and key.startswith(self.tasks_prefix):
            handle, _, idx = key[len(self.tasks_prefix):].rpartition("/")
            if len(idx) == 6 and idx.isdigit() and handle:
                return self.tasks.get(handle, {}).get(int(idx), default)
        d, k = self._place(key)
        return d.get(k, default)

    def __getitem__(self, key: str) -> int:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __setitem__(self, key: str, revision: int) -> None:
        d, k = self._place(key)
        d[k] = revision

    def __delitem__(self, key: str) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: str, default=_MISSING):
        if key not in self:
            if default is _MISSING:
                raise KeyError(key)
            return default
        d, k = self._place(key)
        v = d.pop(k)
        self._gone(d, key)
        return v

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return self.get(key, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        yield from self._other
        for handle, by_index in self.tasks.items():  # whole keys one at a time, not all of them at once
            base = f"{self.tasks_prefix}{handle}/"
            for index in by_index:
                yield f"{base}{index:06d}"
        for mid in self.machines:
            yield self.prefix + mid

    def __len__(self) -> int:
        return len(self._other) + len(self.machines) + sum(map(len, self.tasks.values()))
