"""Where controld may send a job's TaskControl calls (issue #24): loopback, link-local, unspecified
and the control plane's own addresses are refused unless the entitlement allows the network, and
the refusal is made on the address a connection is actually made to."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from controlplane.taskcontrol.reach import Reach, Refused

CASES = [
    ("127.0.0.1", (), "a loopback address"),
    ("127.8.9.10", (), "a loopback address"),
    ("::1", (), "a loopback address"),
    ("::ffff:127.0.0.1", (), "a loopback address"),  # IPv4-mapped: the same address
    ("169.254.169.254", (), "a link-local address"),
    ("fe80::1", (), "a link-local address"),
    ("fe80::1%eth0", (), "a link-local address"),
    ("0.0.0.0", (), "an unspecified address"),
    ("::", (), "an unspecified address"),
    ("127.0.0.1", ("127.0.0.0/8",), None),
    ("169.254.169.254", ("169.254.169.254/32",), None),
    ("169.254.1.1", ("169.254.169.254/32",), "a link-local address"),
    ("203.0.113.7", (), None),
    ("2001:db8::7", (), None),
]


@pytest.mark.parametrize("address, allowed, why", CASES)
def test_what_is_refused_unless_allowed(address, allowed, why):
    got = Reach().refusal(address, allowed)
    assert (got is None) if why is None else (why.removeprefix("an ").removeprefix("a ") in got), got


class Resolver(asyncio.SelectorEventLoop):
    """The event loop's resolver, answering for one made-up name of a control host: no test
    sends a DNS query off this machine, and its /etc/hosts names only loopback addresses."""

    async def getaddrinfo(self, host, *args, **kwargs):
        if host == "control-1.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("198.51.100.20", 0))]
        return await super().getaddrinfo(host, *args, **kwargs)


def test_the_control_planes_own_addresses_are_refused_names_resolved():
    reach = Reach(lambda: ["198.51.100.9", "control-1.example"])
    with asyncio.Runner(loop_factory=Resolver) as runner:
        runner.run(reach.refresh())
    assert "the control plane itself" in reach.refusal("198.51.100.9")
    assert "the control plane itself" in reach.refusal("198.51.100.20"), "a member's name, resolved"
    assert reach.refusal("198.51.100.10") is None
    own = next((a.address for addrs in __import__("psutil").net_if_addrs().values() for a in addrs
                if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    assert own is not None, "this host has an IPv4 address besides loopback (the test needs one)"
    assert "the control plane itself" in reach.refusal(own), "this host's own interfaces are the control plane's"
    assert reach.refusal(own, (f"{own}/32",)) is None


def test_a_host_whose_interfaces_cannot_be_listed_still_checks_urls_and_says_why_once(monkeypatch, caplog):
    """Under a systemd unit whose RestrictAddressFamilies leaves out AF_NETLINK, getifaddrs fails
    with EAFNOSUPPORT (seen in the VM region: every job with a controller was a 500). Stood in for
    here by psutil raising that error: the members' addresses are still refused, the URL checked,
    and the log says it once."""
    import errno
    import psutil

    def refused():
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(psutil, "net_if_addrs", refused)
    reach = Reach(lambda: ["198.51.100.9"])

    async def main():
        got = [await reach.check_url("http://198.51.100.9:9/", ()), await reach.check_url("http://127.0.0.1:9/", ()),
               await reach.check_url("http://127.0.0.1:9/", ("127.0.0.0/8",))]
        reach._own_at = -1e9  # noqa: SLF001 - resolved again, as after OWN_TTL
        await reach.refresh()
        return got

    with caplog.at_level("WARNING", logger="twine.controld.taskcontrol"):
        member, loopback, allowed = asyncio.run(main())
    assert "the control plane itself" in member and "a loopback address" in loopback and allowed is None
    assert [r.getMessage() for r in caplog.records if "cannot be listed" in r.getMessage()] == [
        "this host's own addresses cannot be listed ([Errno 97] Address family not supported by protocol): a "
        "controller's URL is refused at loopback and link-local addresses and the members' only"]


def test_concurrent_callers_share_one_resolution_of_the_control_planes_addresses():
    asked = []
    reach = Reach(lambda: asked.append(1) or ["control-1.example"])  # a name: resolving it waits

    async def main():
        await asyncio.gather(*(reach.refresh() for _ in range(5)))

    with asyncio.Runner(loop_factory=Resolver) as runner:
        runner.run(main())
    assert asked == [1] and "the control plane itself" in reach.refusal("198.51.100.20")


def test_a_url_is_checked_on_what_its_name_resolves_to():
    reach = Reach()

    async def check():
        # names from /etc/hosts only: a test sends no DNS query off this machine
        return [await reach.check_url("http://localhost:9/", ()), await reach.check_url("http://localhost:9/", ("127.0.0.0/8",)),
                await reach.check_url("http://169.254.169.254/latest", ())]

    by_name, allowed, metadata = asyncio.run(check())
    # localhost is 127.0.0.1 or ::1, whichever the host's resolver gives first
    assert "localhost resolves to" in by_name and "a loopback address" in by_name and "allow_controller_networks" in by_name
    assert allowed is None and "169.254.169.254, a link-local address" in metadata


def test_a_connection_is_refused_at_the_address_before_it_is_made():
    """A real server on loopback: the connector refuses to connect to it (no request reaches it)
    unless the network is allowed."""
    got: list[str] = []

    async def main():
        app = web.Application()

        async def hello(request):
            got.append(request.path)
            return web.Response(text="hi")

        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        reach = Reach()
        try:
            async with aiohttp.ClientSession(connector=reach.connector(())) as s:
                with pytest.raises(aiohttp.ClientConnectorError) as e:
                    await s.get(f"http://localhost:{port}/")
                assert isinstance(e.value.os_error, Refused) and "loopback" in str(e.value.os_error)
            async with aiohttp.ClientSession(connector=reach.connector(("127.0.0.0/8",))) as s:
                async with s.get(f"http://localhost:{port}/") as r:
                    assert await r.text() == "hi"
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert got == ["/"], "the refused connection never reached the server"
