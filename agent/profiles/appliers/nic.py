"""Link settings of network interfaces in the agent's network namespace, chosen by glob.

    [nic]
    "eth*" = { mtu = 9000, txqueuelen = 10000 }

Two value forms, both accepted by write():
  desired  {"mtu": 9000, "txqueuelen": 10000}          for every matching interface
  saved    {"eth0": {"mtu": 1500, "txqueuelen": 1000}}  what read() returns: each interface's
                                                        own values, so a rollback restores each.
pyroute2 is imported only when a [nic] section is used: it costs a quarter second at start-up.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from fnmatch import fnmatchcase
from typing import Any, Iterator, Mapping

from agent.errors import ProfileError
from agent.profiles.appliers.base import NETNS, Applier, ApplierError
from agent.profiles.model import Differs, Holds, NotApplicable, Setting, Verdict

_FIELDS = {"mtu": (68, 65535), "txqueuelen": (0, 1_000_000)}  # IPv4's minimum MTU; 16-bit MTU field
_NETLINK = {"mtu": "mtu", "txqueuelen": "txqlen"}


@contextmanager
def _ipr() -> Iterator[Any]:
    # One socket per call: IPRoute binds to the namespace it is opened in (`ip netns exec`).
    from pyroute2 import IPRoute

    ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


class Nic(Applier):
    name = "nic"
    order = 60

    def scope(self, key: str) -> str:
        return NETNS

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        settings = []
        for pattern, value in section.items():
            field = f"[nic] {pattern}"
            if not isinstance(pattern, str) or not pattern or "/" in pattern:
                raise ProfileError(origin, field, value, 'not an interface name or glob like "eth*"')
            if not isinstance(value, dict) or not value:
                raise ProfileError(origin, field, value, "must be a table like { mtu = 9000, txqueuelen = 10000 }")
            unknown = sorted(set(value) - set(_FIELDS))
            if unknown:
                raise ProfileError(origin, field, value, f"unknown fields {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
            for name, v in value.items():
                lo, hi = _FIELDS[name]
                if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                    raise ProfileError(origin, f"{field} {name}", v, f"must be an integer from {lo} to {hi}")
            settings.append(Setting(self.name, pattern, dict(sorted(value.items())), origin))
        return settings

    def _links(self, pattern: str) -> dict[str, tuple[int, dict[str, int]]]:
        """Matching interface name -> (index, {"mtu", "txqueuelen"})."""
        with _ipr() as ipr:
            links = ipr.get_links()
        out = {}
        for link in links:
            name = link.get_attr("IFLA_IFNAME")
            if fnmatchcase(name, pattern):
                out[name] = (link["index"], {"mtu": link.get_attr("IFLA_MTU"), "txqueuelen": link.get_attr("IFLA_TXQLEN")})
        return dict(sorted(out.items()))

    def check(self, settings: list[Setting]) -> None:
        owner: dict[tuple[str, str], Setting] = {}  # two patterns setting one field differently would fight
        for s in settings:
            for ifname in self._links(s.key):
                for name, v in s.value.items():
                    other = owner.setdefault((ifname, name), s)
                    if other.value[name] != v:
                        raise ProfileError(
                            s.origin, f"[nic] {s.key} {name}", v,
                            f"{ifname} is also matched by {other.key!r} with {name} = {other.value[name]}",
                        )

    def applicable(self, key: str) -> NotApplicable | None:
        if not self._links(key):
            return NotApplicable(f"no interface matches {key!r} in this network namespace")
        return None

    def read(self, key: str) -> dict[str, dict[str, int]]:
        return {name: values for name, (_, values) in self._links(key).items()}

    def _targets(self, key: str, value: dict) -> dict[str, tuple[int, dict[str, int]]]:
        """Interface -> (index, wanted fields). Saved form: values are tables per interface."""
        links = self._links(key)
        if all(isinstance(v, dict) for v in value.values()):
            # An interface that has gone since it was saved has nothing to restore.
            return {n: (links[n][0], want) for n, want in value.items() if n in links}
        return {n: (index, value) for n, (index, _) in links.items()}

    def write(self, key: str, value: dict) -> None:
        from pyroute2 import NetlinkError

        with _ipr() as ipr:
            for ifname, (index, want) in self._targets(key, value).items():
                args = {_NETLINK[k]: v for k, v in want.items()}
                try:
                    ipr.link("set", index=index, **args)
                except NetlinkError as e:
                    wanted = ", ".join(f"{k}={v}" for k, v in want.items())
                    raise ApplierError(f"setting {wanted} on {ifname}: {os.strerror(e.code)}") from e

    def verify(self, key: str, value: dict) -> Verdict:
        links = self._links(key)
        problems = [
            f"{ifname} has {name} {links[ifname][1][name]}, wanted {v}"
            for ifname, (_, want) in self._targets(key, value).items()
            for name, v in want.items()
            if links[ifname][1][name] != v
        ]
        if problems:
            return Differs(self.read(key), "; ".join(problems))
        return Holds()


APPLIER = Nic
