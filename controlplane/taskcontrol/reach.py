"""Where controld may send a job's TaskControl calls (issue #24).

A job owner names the controller's URL; controld POSTs to it from inside the control plane. Left
unchecked, that is a way for any job owner to make controld call what only it can reach: its own
loopback (etcd's client port, the API), a cloud's metadata service (169.254.169.254), the control
plane's other hosts. So controld refuses loopback, link-local and unspecified addresses, and the
addresses of the control plane itself (its members' hosts, etcd's, this host's own interfaces),
unless an admin allowed a network on the job's entitlement (`allow_controller_networks`).

The check is made twice: when a job is created or updated, on what its controller's name resolves
to then (a clear 422); and at every call, on the address actually connected to (aiohttp's
socket_factory sees each address before the connection is made), so that a name that later
resolves elsewhere is refused all the same.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import logging
import socket
import time
from typing import Callable, Iterable
from urllib.parse import urlsplit

import aiohttp
import psutil

log = logging.getLogger("twine.controld.taskcontrol")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
KINDS = (("loopback", "is_loopback"), ("link-local", "is_link_local"), ("unspecified", "is_unspecified"))
OWN_TTL = 30.0  # seconds the control plane's own addresses are kept before they are resolved again
ALLOW_HINT = "an admin may allow its network on the entitlement (allow_controller_networks)"


class Refused(OSError):
    """A connection to a controller's address that the policy refuses (raised before connecting)."""


def _address(text: str) -> Address:
    a = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is not part of the address
    return a.ipv4_mapped if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped else a


@functools.lru_cache(maxsize=256)
def networks(texts: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """An entitlement's allowed networks (CIDR texts, checked and normalised when they were
    stored: store/records.py controller_networks), parsed once for every connection made."""
    return tuple(ipaddress.ip_network(t, strict=False) for t in texts)


class Reach:
    def __init__(self, own_hosts: Callable[[], Iterable[str]] = lambda: ()):
        self.own_hosts = own_hosts  # the control plane's hosts (members' and etcd's), names or addresses
        self._own: frozenset[Address] = frozenset()
        self._own_at = -OWN_TTL
        self._resolving: asyncio.Future | None = None
        self._unlisted = False  # this host's interfaces could not be listed (said once in the log)

    def refusal(self, address: str, allowed: Iterable[str] = ()) -> str | None:
        """Why a connection to `address` is refused, or None when it may be made."""
        a = _address(address)
        if any(a in n for n in networks(tuple(allowed))):
            return None
        for why, test in KINDS:
            if getattr(a, test):
                return f"{a}, {'an' if why[0] in 'aeiou' else 'a'} {why} address"
        if a in self._own:
            return f"{a}, an address of the control plane itself"
        return None

    async def refresh(self) -> None:
        """The control plane's own addresses, resolved again when they are older than OWN_TTL (one
        resolution at a time, which every caller of the moment waits for)."""
        if time.monotonic() - self._own_at < OWN_TTL:
            return
        if self._resolving is None or self._resolving.done():
            self._resolving = asyncio.ensure_future(self._resolve())
        await asyncio.shield(self._resolving)

    async def _resolve(self) -> None:
        found: set[Address] = set()
        try:
            interfaces = psutil.net_if_addrs().values()  # this host's: controld runs here
        except OSError as e:  # getifaddrs needs netlink (a unit's RestrictAddressFamilies may forbid it)
            if not self._unlisted:
                log.warning("this host's own addresses cannot be listed (%s): a controller's URL is refused at "
                            "loopback and link-local addresses and the members' only", e)
            self._unlisted = True
            interfaces = []
        for addrs in interfaces:
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    found.add(_address(a.address))
        loop = asyncio.get_running_loop()
        for host in set(self.own_hosts()):
            try:
                found.add(_address(host))
                continue
            except ValueError:
                pass
            try:
                infos = await asyncio.wait_for(loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), 5)
            except (OSError, TimeoutError):
                continue  # a member's name that does not resolve here is no address we could reach either
            found |= {_address(info[4][0]) for info in infos}
        self._own, self._own_at = frozenset(found), time.monotonic()

    async def check_url(self, url: str, allowed: Iterable[str] = ()) -> str | None:
        """Why a controller at `url` is refused now (what its host resolves to), or None. A name
        that does not resolve (yet) is not refused here: each call checks the address it connects to."""
        await self.refresh()
        host = urlsplit(url).hostname or ""
        try:
            why = self.refusal(host, allowed)
            return None if why is None else f"{url} is at {why}; {ALLOW_HINT}"
        except ValueError:
            pass  # a name
        try:
            infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM), 5)
        except (OSError, TimeoutError):
            return None
        for info in infos:
            if why := self.refusal(info[4][0], allowed):
                return f"{url}: {host} resolves to {why}; {ALLOW_HINT}"
        return None

    def connector(self, allowed: Iterable[str] = ()) -> aiohttp.TCPConnector:
        """A connector that refuses, before connecting, every address the policy refuses."""
        allowed = tuple(allowed)

        def socket_factory(addr_info) -> socket.socket:
            family, type_, proto, _, sockaddr = addr_info
            if why := self.refusal(sockaddr[0], allowed):
                raise Refused(errno.EACCES, f"refused to connect to {why}; {ALLOW_HINT}")
            return socket.socket(family=family, type=type_, proto=proto)

        return aiohttp.TCPConnector(socket_factory=socket_factory)
