"""Each key's mod revision, as the region's view keeps them (RegionState.revs): what transaction
guards compare, and what the index's fresh read after an outage compares with etcd's (Index's
`revisions`).

A machine's revision is kept under its id, the one string its record and the view's machines dict
share, not under its whole key (`/twine/<region>/machines/<id>`): at a million machines, that key
was a string of about 80 bytes each, in every process (issue #38). Every other key is kept whole.
The mapping reads and iterates as whole keys either way.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Iterator

_MISSING = object()


class Revisions(MutableMapping):
    __slots__ = ("prefix", "machines", "_other")

    def __init__(self, machines_prefix: str):
        self.prefix = machines_prefix  # Keys.machines(): a key under it is a machine's
        # machine id -> its record's mod revision, read and written directly by the view with the
        # id string the machine's record holds (so that no second copy of it is kept)
        self.machines: dict[str, int] = {}
        self._other: dict[str, int] = {}  # whole key -> mod revision, every other key

    def _place(self, key: str) -> tuple[dict[str, int], str]:
        if key.startswith(self.prefix):
            return self.machines, key[len(self.prefix):]
        return self._other, key

    def get(self, key: str, default: int | None = None) -> int | None:
        d, k = self._place(key)
        return d.get(k, default)

    def __getitem__(self, key: str) -> int:
        d, k = self._place(key)
        return d[k]

    def __setitem__(self, key: str, revision: int) -> None:
        d, k = self._place(key)
        d[k] = revision

    def __delitem__(self, key: str) -> None:
        d, k = self._place(key)
        del d[k]

    def pop(self, key: str, default=_MISSING):
        d, k = self._place(key)
        return d.pop(k) if default is _MISSING else d.pop(k, default)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        d, k = self._place(key)
        return k in d

    def __iter__(self) -> Iterator[str]:
        yield from self._other
        for mid in self.machines:  # whole keys one at a time, not all of them at once
            yield self.prefix + mid

    def __len__(self) -> int:
        return len(self._other) + len(self.machines)
