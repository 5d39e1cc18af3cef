"""The dev region's network: a bridge, and a network namespace per agent behind a veth (see the
package's docstring for the layout and what it can reach)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from typing import Self, TypeVar


log = logging.getLogger("twine.devregion")

SUBNET_POOL = ipaddress.ip_network("10.250.0.0/16")
FIRST_HOST = 10  # agent i gets .(10 + i)
MAX_AGENTS = 254 - FIRST_HOST
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$")

T = TypeVar("T")


def ip_binary() -> str:
    return shutil.which("ip") or "/usr/sbin/ip"


# --------------------------------------------------------------------------------------------
# network namespaces


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run `fn` in a fresh thread that has joined network namespace `ns` (setns applies to the
    calling thread only), e.g. to open a socket that lives in `ns`. The thread ends afterwards."""
    from pyroute2 import netns as pnetns

    out: dict = {}

    def run() -> None:
        try:
            pnetns.setns(ns, flags=0, fork=False)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, name=f"netns:{ns}", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def ns_socket(ns: str, family: int = socket.AF_INET, type_: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket in network namespace `ns` (usable from any thread of this process)."""
    return in_netns(ns, lambda: socket.socket(family, type_))


def ns_http_get(ns: str, host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET http://host:port/path as seen from inside network namespace `ns`."""

    class _Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            s = ns_socket(ns)
            s.settimeout(timeout)
            try:
                s.connect((host, port))
            except BaseException:
                s.close()
                raise
            self.sock = s

    conn = _Conn(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_sysctl(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _lock_path() -> str:
    return "/run/twine-devregion.lock" if os.access("/run", os.W_OK) else os.path.join(tempfile.gettempdir(), "twine-devregion.lock")


@contextlib.contextmanager
def _allocation_lock():
    """Serializes choosing a prefix and a subnet across processes (parallel test runs)."""
    with open(_lock_path(), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass
class NsInfo:
    name: str  # the agent's name
    netns: str
    host_if: str
    ip: str
    index: int


class Network:
    """One Linux bridge with an address on the host, and per member one network namespace joined
    to the bridge by a veth pair. See the package's docstring for the scheme.

    `Network().create()`, `.add_namespace("m1")`, ..., `.destroy()`. `destroy()` removes every link
    and namespace whose name starts with `<prefix>-`, so it also cleans up after a partial create
    and is safe to call twice (or from `Network.from_dict(...)` in another process)."""

    def __init__(self, prefix: str | None = None, subnet: str | None = None,
                 on_change: Callable[[Network], None] | None = None) -> None:
        self.prefix = prefix
        self.subnet = ipaddress.ip_network(subnet) if subnet else None
        self.namespaces: dict[str, NsInfo] = {}
        self.on_change = on_change
        self.created = False

    # names ------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{self._p()}-br"

    @property
    def bridge_ip(self) -> str:
        assert self.subnet is not None, "network not created"
        return str(self.subnet[1])

    def netns_name(self, name: str) -> str:
        return f"{self._p()}-{name}"

    def ip(self, name: str) -> str:
        return self.namespaces[name].ip

    def _p(self) -> str:
        assert self.prefix is not None, "network not created"
        return self.prefix

    def to_dict(self) -> dict:
        return {
            "prefix": self.prefix, "subnet": str(self.subnet) if self.subnet else None,
            "bridge": self.bridge if self.prefix else None,
            "bridge_ip": self.bridge_ip if self.subnet else None,
            "namespaces": {k: asdict(v) for k, v in self.namespaces.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> Network:
        n = cls(d.get("prefix"), d.get("subnet"))
        n.namespaces = {k: NsInfo(**v) for k, v in (d.get("namespaces") or {}).items()}
        n.created = n.prefix is not None
        return n

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    # creation ---------------------------------------------------------------------------
    def create(self) -> Network:
        """Choose a free prefix and /24 (under a host-wide lock) and create the bridge."""
        from pyroute2 import IPRoute

        with _allocation_lock(), IPRoute() as ipr:
            if self.prefix is None:
                self.prefix = _free_prefix(ipr)
            if self.subnet is None:
                self.subnet = _free_subnet(ipr)
            elif _subnet_taken(ipr, self.subnet):
                raise RuntimeError(f"{self.subnet} is already routed or addressed on this host")
            self._changed()  # recorded before anything exists
            self.created = True
            ipr.link("add", ifname=self.bridge, kind="bridge")
            br = ipr.link_lookup(ifname=self.bridge)[0]
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{self.bridge}/disable_ipv6", "1")
            _write_sysctl(f"/proc/sys/net/ipv4/conf/{self.bridge}/forwarding", "0")
            ipr.addr("add", index=br, address=self.bridge_ip, prefixlen=self.subnet.prefixlen)
            ipr.link("set", index=br, state="up")
        self.verify()
        return self

    def add_namespace(self, name: str) -> str:
        """Create netns `<prefix>-<name>` joined to the bridge; returns its address."""
        from pyroute2 import IPRoute
        from pyroute2 import netns as pnetns

        if not self.created:
            raise RuntimeError("create() the network first")
        if not NAME_RE.fullmatch(name):
            raise ValueError(f"namespace member name {name!r}: 1-20 of a-z, 0-9, '-'")
        if name in self.namespaces:
            raise ValueError(f"{name!r} is already in the network")
        i = len(self.namespaces)
        if i >= MAX_AGENTS:
            raise ValueError(f"at most {MAX_AGENTS} namespaces per network")
        info = NsInfo(name=name, netns=self.netns_name(name), host_if=f"{self._p()}-h{i}",
                      ip=str(self.subnet[FIRST_HOST + i]), index=i)
        peer = f"{self._p()}-p{i}"
        self.namespaces[name] = info
        self._changed()  # recorded before anything exists

        pnetns.create(info.netns)

        def ns_sysctls() -> None:
            for conf in ("all", "default"):
                _write_sysctl(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "1")
                _write_sysctl(f"/proc/sys/net/ipv4/conf/{conf}/forwarding", "0")

        in_netns(info.netns, ns_sysctls)
        with IPRoute() as ipr:
            br = ipr.link_lookup(ifname=self.bridge)[0]
            ipr.link("add", ifname=info.host_if, kind="veth", peer={"ifname": peer})
            h = ipr.link_lookup(ifname=info.host_if)[0]
            p = ipr.link_lookup(ifname=peer)[0]
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{info.host_if}/disable_ipv6", "1")
            _write_sysctl(f"/proc/sys/net/ipv4/conf/{info.host_if}/forwarding", "0")
            ipr.link("set", index=h, master=br)
            ipr.brport("set", index=h, isolated=1)  # members reach the host, not each other
            ipr.link("set", index=p, net_ns_fd=info.netns)
            ipr.link("set", index=h, state="up")
        with IPRoute(netns=info.netns, flags=0) as nsr:
            p = nsr.link_lookup(ifname=peer)[0]
            nsr.link("set", index=p, ifname="eth0")
            nsr.addr("add", index=p, address=info.ip, prefixlen=self.subnet.prefixlen)
            nsr.link("set", index=p, state="up")
            nsr.link("set", index=nsr.link_lookup(ifname="lo")[0], state="up")
        self.verify(name)
        return info.ip

    def verify(self, *names: str) -> None:
        """Check the isolation: the bridge does not forward, and each namespace (all, or `names`)
        routes nothing but its own /24. Raises RuntimeError if not."""
        from pyroute2 import IPRoute

        problems = []
        for ifname in (self.bridge, *(self.namespaces[n].host_if for n in names or self.namespaces)):
            try:
                if _read_sysctl(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding") != "0":
                    problems.append(f"{ifname} forwards IPv4")
            except OSError as e:
                problems.append(f"{ifname}: {e}")
        for name in names or tuple(self.namespaces):
            info = self.namespaces[name]
            with IPRoute(netns=info.netns, flags=0) as nsr:
                for r in nsr.route("dump", family=socket.AF_INET, table=254):
                    dst = r.get_attr("RTA_DST")
                    net = ipaddress.ip_network(f"{dst or '0.0.0.0'}/{r['dst_len']}", strict=False)
                    if net != self.subnet:
                        problems.append(f"netns {info.netns} routes {net}")
        if problems:
            raise RuntimeError("network isolation does not hold: " + "; ".join(problems))

    # teardown ---------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """Links and namespaces of this network that exist now."""
        if self.prefix is None:
            return {"links": [], "netns": []}
        from pyroute2 import IPRoute
        from pyroute2 import netns as pnetns

        mark = f"{self.prefix}-"
        with IPRoute() as ipr:
            links = [l.get_attr("IFLA_IFNAME") for l in ipr.get_links()]
        return {
            "links": sorted(n for n in links if n and n.startswith(mark)),
            "netns": sorted(n for n in pnetns.listnetns() if n.startswith(mark)),
        }

    def destroy(self) -> list[str]:
        """Remove every link and namespace named `<prefix>-*`. Processes still inside one of our
        namespaces are killed first (they are ours: nobody else knows the random prefix).
        Returns the problems met (empty: all gone)."""
        if self.prefix is None:
            return []
        from pyroute2 import IPRoute
        from pyroute2 import netns as pnetns

        problems: list[str] = []
        left = self.leftovers()
        for ns in left["netns"]:
            for pid in _pids_in_netns(ns):
                problems.append(f"pid {pid} was still running in netns {ns}: killed")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with IPRoute() as ipr:
            # host ends first (each takes its peer along), the bridge last
            for name in sorted(left["links"], key=lambda n: n == self.bridge):
                try:
                    for idx in ipr.link_lookup(ifname=name):
                        ipr.link("del", index=idx)
                except Exception as e:  # noqa: BLE001
                    if getattr(e, "code", None) != errno.ENODEV:
                        problems.append(f"delete link {name}: {e}")
        for ns in left["netns"]:
            try:
                pnetns.remove(ns)
            except FileNotFoundError:
                pass
            except OSError as e:
                problems.append(f"remove netns {ns}: {e}")
        still = self.leftovers()
        if still["links"] or still["netns"]:
            problems.append(f"left behind: {still}")
        self.created = False
        return problems

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(self, *exc) -> None:
        problems = self.destroy()
        if problems:
            log.warning("network %s teardown: %s", self.prefix, "; ".join(problems))


PREFIX_RE = re.compile(r"tw[0-9a-f]{4}")


def orphaned_prefixes(min_age: float = 600.0, only: Collection[str] | None = None) -> list[str]:
    """The prefixes (of `only`, if given) of networks a process that is gone left behind (SIGKILLed before its teardown):
    every namespace of the prefix empty of processes and made more than `min_age` seconds ago (a
    network being built by a live process has a process in it within seconds)."""
    from pyroute2 import netns as pnetns

    by_prefix: dict[str, list[str]] = {}
    for ns in pnetns.listnetns():
        prefix, _, member = ns.partition("-")
        if member and PREFIX_RE.fullmatch(prefix) and (only is None or prefix in only):
            by_prefix.setdefault(prefix, []).append(ns)
    now = time.time()
    out = []
    for prefix, spaces in sorted(by_prefix.items()):
        try:
            old = all(now - os.stat(f"/var/run/netns/{ns}").st_mtime > min_age for ns in spaces)
        except OSError:
            continue
        if old and not any(_pids_in_netns(ns) for ns in spaces):
            out.append(prefix)
    return out


def _pids_in_netns(ns: str) -> list[int]:
    try:
        st = os.stat(f"/var/run/netns/{ns}")
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            s = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            pids.append(int(entry))
    return pids


def _free_prefix(ipr) -> str:
    from pyroute2 import netns as pnetns

    links = [l.get_attr("IFLA_IFNAME") or "" for l in ipr.get_links()]
    spaces = pnetns.listnetns()
    for _ in range(100):
        prefix = "tw" + secrets.token_hex(2)
        mark = prefix + "-"
        if not any(n.startswith(mark) for n in (*links, *spaces)):
            return prefix
    raise RuntimeError("no free region prefix")


def _host_networks(ipr) -> list[ipaddress.IPv4Network]:
    nets = []
    for r in ipr.route("dump", family=socket.AF_INET):  # every table
        if r["dst_len"] > 0:
            nets.append(ipaddress.ip_network(f"{r.get_attr('RTA_DST')}/{r['dst_len']}", strict=False))
    for a in ipr.get_addr(family=socket.AF_INET):
        nets.append(ipaddress.ip_interface(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}").network)
    return nets


def _subnet_taken(ipr, subnet) -> bool:
    return any(subnet.overlaps(n) for n in _host_networks(ipr))


def _free_subnet(ipr) -> ipaddress.IPv4Network:
    taken = _host_networks(ipr)
    for candidate in SUBNET_POOL.subnets(new_prefix=24):
        if not any(candidate.overlaps(n) for n in taken):
            return candidate
    raise RuntimeError(f"every /24 of {SUBNET_POOL} is already routed on this host")
