"""Persistent huge pages per page size, host-wide or per NUMA node.

    [hugepages]
    "2M" = 512            # host-wide count of 2 MiB pages
    "1G@node0" = 4        # 1 GiB pages on NUMA node 0 only

Keys are normalised to "2M" / "1G" (also accepted: "2048kB", "1048576kB"), values are counts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from agent.errors import ProfileError
from agent.profiles.appliers.base import Applier, ApplierError
from agent.profiles.model import Differs, Holds, NotApplicable, Setting, Verdict

_SIZES = {2048: "2M", 1048576: "1G"}  # kB -> name; the sizes x86-64 offers
_UNITS = {"kB": 1, "K": 1, "M": 1024, "G": 1024 * 1024}
_KEY = re.compile(r"^(\d+)(kB|K|M|G)(?:@node(\d+))?$")
_KEEP_FREE = 0.10  # share of MemTotal that huge pages must never take: the kernel and tasks need it


def _split(key: str) -> tuple[int, int | None]:
    """Page size in kB and NUMA node of a key parse() normalised, e.g. "2M@node1" -> (2048, 1)."""
    m = _KEY.fullmatch(key)
    assert m, key
    return int(m[1]) * _UNITS[m[2]], None if m[3] is None else int(m[3])


class HugePages(Applier):
    name = "hugepages"
    order = 20

    def _dir(self, kb: int, node: int | None) -> Path:
        if node is None:
            return self.ctx.sys / "kernel/mm/hugepages" / f"hugepages-{kb}kB"
        return self.ctx.sys / f"devices/system/node/node{node}/hugepages/hugepages-{kb}kB"

    def _path(self, key: str) -> Path:
        return self._dir(*_split(key)) / "nr_hugepages"

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        settings = []
        for key, value in section.items():
            field = f"[hugepages] {key}"
            m = _KEY.fullmatch(str(key))
            kb = int(m[1]) * _UNITS[m[2]] if m else None
            if kb not in _SIZES:
                known = ", ".join(f"{n} ({k}kB)" for k, n in _SIZES.items())
                raise ProfileError(origin, field, value, f"not a huge page size; known: {known}, optionally @nodeN")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ProfileError(origin, field, value, "must be a non-negative count of pages")
            node = "" if m[3] is None else f"@node{int(m[3])}"
            settings.append(Setting(self.name, _SIZES[kb] + node, value, origin))
        return settings

    def applicable(self, key: str) -> NotApplicable | None:
        kb, _ = _split(key)
        size_dir = self._dir(kb, None)
        if not size_dir.is_dir():
            return NotApplicable(f"this host has no {_SIZES[kb]} huge pages ({size_dir} does not exist)")
        return None

    def check(self, settings: list[Setting]) -> None:
        seen: dict[str, Setting] = {}
        for s in settings:
            kb, node = _split(s.key)
            field = f"[hugepages] {s.key}"
            if s.key in seen:
                raise ProfileError(s.origin, field, s.value, "set twice (e.g. as both 2M and 2048kB)")
            seen[s.key] = s
            if node is not None and not (self.ctx.sys / f"devices/system/node/node{node}").is_dir():
                nodes = sorted(p.name for p in (self.ctx.sys / "devices/system/node").glob("node[0-9]*"))
                raise ProfileError(s.origin, field, s.value, f"no NUMA node {node} on this host (nodes: {', '.join(nodes) or 'none'})")
        # Per-node counts add up to the host-wide one: setting both would make them fight.
        for s in settings:
            size = s.key.split("@")[0]
            if "@" in s.key and size in seen:
                raise ProfileError(s.origin, f"[hugepages] {s.key}", s.value, f"set {size} either host-wide or per node, not both")
        need_kb = sum(max(0, s.value - self.read(s.key)) * _split(s.key)[0] for s in settings)
        if need_kb == 0:
            return
        meminfo = self._meminfo()
        spare_kb = meminfo["MemAvailable"] - int(meminfo["MemTotal"] * _KEEP_FREE)
        if need_kb > spare_kb:
            growing = [s for s in settings if s.value > self.read(s.key)]
            value = growing[0].value if len(growing) == 1 else {s.key: s.value for s in growing}
            raise ProfileError(
                growing[0].origin, "[hugepages] " + ", ".join(s.key for s in growing), value,
                f"needs {need_kb // 1024} MiB, host has {max(0, spare_kb) // 1024} MiB available "
                f"(MemAvailable {meminfo['MemAvailable'] // 1024} MiB less {_KEEP_FREE:.0%} of MemTotal kept free)",
            )

    def _meminfo(self) -> dict[str, int]:
        out = {}
        for line in (self.ctx.proc / "meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            out[name] = int(rest.split()[0])
        return out

    def read(self, key: str) -> int:
        return int(self._path(key).read_text())

    def write(self, key: str, value: int) -> None:
        if value > self.read(key):
            # Huge pages need contiguous memory: compacting first lets the kernel find more of it.
            try:
                (self.ctx.proc / "sys/vm/compact_memory").write_text("1")
            except OSError:
                pass  # no CONFIG_COMPACTION: the kernel allocates what it can without it
        try:
            self._path(key).write_text(str(value))
        except OSError as e:
            raise ApplierError(f"writing {value} to {self._path(key)}: {e.strerror}") from e

    def verify(self, key: str, value: int) -> Verdict:
        have = self.read(key)
        size, _, node = key.partition("@")
        where = f" on {node}" if node else ""
        if have == value:
            return Holds()
        if have < value:
            return Differs(have, f"reached {have} of {value} {size} pages{where} (short {value - have})")
        return Differs(have, f"{have} {size} pages{where}, wanted {value} ({have - value} in use cannot be freed)")


APPLIER = HugePages
