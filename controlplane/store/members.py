"""The members of a region's etcd cluster, for an operator growing it host by host (as
`etcdctl member add|list|remove` would: etcdctl is not among etcd-server's files).

A new control host joins in two steps: an existing member is told of it (`add`, which prints the
cluster it will join), then the new host's etcd starts with that cluster and
`--initial-cluster-state existing` (scripts/install-controld.sh --etcd-join does both halves). A
member added but never started leaves the cluster one vote short: remove it (`remove`).

    python -m controlplane.store.members --endpoint 127.0.0.1:2379 --ca CA --cert ROOT.pem --key ROOT-key.pem \\
        list | status | add NAME https://IP:2380 | remove NAME | move-leader NAME | defrag [NAME]

`status` asks every member at its client URL (as `etcdctl endpoint status --cluster`): a line
each, `NAME leader|follower|unreachable (why) revision R`; it exits 3 unless every member answers
and all follow one leader. `move-leader NAME` hands the leadership to that member (before taking
the leader's host down for maintenance). `defrag` gives each member's free pages back to the disk,
one member at a time (compaction frees revisions, not disk; a member defragmenting answers nothing
meanwhile: do it at a quiet hour).

With etcd's auth on, the admin's certificate (common name root) is the one that may change members.
Exit codes: 0 done, 2 bad input (a file, a name, a URL), 3 etcd unreachable or refusing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

import grpc
from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

from agent.errors import InputError
from controlplane.store.etcdtls import EtcdTls, admin_command


@dataclass(frozen=True)
class Member:
    id: int
    name: str  # "" for a member added that has not started yet
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]


def _member(m) -> Member:
    return Member(m.ID, m.name, tuple(m.peerURLs), tuple(m.clientURLs))


async def _call(endpoint: str, admin: EtcdTls | None, stub, call, timeout: float):
    """`call(stub(channel), timeout)` on a channel to `endpoint` (TLS with the admin's certificate)."""
    channel = grpc.aio.secure_channel(endpoint, admin.credentials()) if admin else grpc.aio.insecure_channel(endpoint)
    async with channel:
        return await call(stub(channel), timeout)


async def _cluster(endpoint: str, admin: EtcdTls | None, call, timeout: float):
    return await _call(endpoint, admin, rpc_pb2_grpc.ClusterStub, call, timeout)


def _named(found: list[Member], name: str) -> Member:
    for m in found:
        if m.name == name or str(m.id) == name:
            return m
    raise InputError("command line", "NAME", name, "no such member (list them: members list)")


async def members(endpoint: str, admin: EtcdTls | None = None, timeout: float = 10.0) -> list[Member]:
    got = await _cluster(endpoint, admin, lambda s, t: s.MemberList(rpc_pb2.MemberListRequest(), timeout=t), timeout)
    return [_member(m) for m in got.members]


async def add(endpoint: str, name: str, peer_url: str, admin: EtcdTls | None = None,
              timeout: float = 10.0) -> str:
    """Tell the cluster of a new member at `peer_url`; the initial cluster it is to start with
    (NAME=PEER_URL,... with its own name for the new one)."""
    parts = urlsplit(peer_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise InputError("command line", "PEER_URL", peer_url, "must be http(s)://HOST:PORT")
    got = await _cluster(endpoint, admin, lambda s, t: s.MemberAdd(rpc_pb2.MemberAddRequest(peerURLs=[peer_url]),
                                                                  timeout=t), timeout)
    everyone = []
    for m in map(_member, got.members):
        who = name if m.id == got.member.ID else m.name
        everyone += [f"{who}={url}" for url in m.peer_urls]
    return ",".join(sorted(everyone))


class Unhealthy(Exception):
    """`status` found a member that does not answer, or no one leader."""


@dataclass(frozen=True)
class Status:
    member: Member
    leader: int  # the leader's id as this member sees it; 0: none
    revision: int
    error: str = ""  # why it did not answer

    @property
    def line(self) -> str:
        name = self.member.name or "(not started)"
        if self.error:
            return f"{name} unreachable ({self.error})"
        return f"{name} {'leader' if self.leader == self.member.id else 'follower'} revision {self.revision}"


def _client_endpoint(m: Member) -> str | None:
    """A member's client address HOST:PORT, another host's where it has one (its loopback URL only
    reaches it from its own host); None for a member added that never started."""
    urls = sorted((urlsplit(u) for u in m.client_urls), key=lambda u: u.hostname.startswith("127."))
    return f"{urls[0].hostname}:{urls[0].port}" if urls else None


async def _maintenance(m: Member, admin: EtcdTls | None, call, timeout: float):
    """A maintenance call at the member itself (status, leadership and defragmentation are each
    member's own)."""
    at = _client_endpoint(m)
    if at is None:
        raise InputError("command line", "NAME", m.name or f"{m.id:x}", "added, never started: no client URL")
    return await _call(at, admin, rpc_pb2_grpc.MaintenanceStub, call, timeout)


async def _status(m: Member, admin: EtcdTls | None, timeout: float) -> Status:
    try:
        s = await _maintenance(m, admin, lambda st, t: st.Status(rpc_pb2.StatusRequest(), timeout=t), timeout)
    except InputError as e:
        return Status(m, 0, 0, e.why)
    except grpc.aio.AioRpcError as e:
        return Status(m, 0, 0, f"{_client_endpoint(m)}: {e.code().name}")
    return Status(m, s.leader, s.header.revision)


async def status(endpoint: str, admin: EtcdTls | None = None, timeout: float = 5.0) -> list[Status]:
    """Every member's own answer, asked at once: reachable, whom it follows, its revision."""
    return list(await asyncio.gather(*(_status(m, admin, timeout) for m in await members(endpoint, admin, timeout))))


def healthy(found: list[Status]) -> bool:
    leaders = {s.leader for s in found}
    return all(not s.error for s in found) and len(leaders) == 1 and 0 not in leaders \
        and any(s.member.id in leaders for s in found)


async def move_leader(endpoint: str, name: str, admin: EtcdTls | None = None, timeout: float = 10.0) -> Member:
    """Hand the leadership to the member `name` (etcd takes it at the leader: it is asked there)."""
    found = await status(endpoint, admin, timeout)
    target = _named([s.member for s in found], name)
    leader = next((s.member for s in found if not s.error and s.leader == s.member.id), None)
    if leader is None:
        raise InputError("command line", "NAME", name, "the cluster has no leader now to hand it over")
    if leader.id != target.id:
        await _maintenance(leader, admin, lambda st, t: st.MoveLeader(rpc_pb2.MoveLeaderRequest(targetID=target.id),
                                                                       timeout=t), timeout)
    return target


async def defrag(endpoint: str, name: str | None = None, admin: EtcdTls | None = None,
                 timeout: float = 120.0) -> list[Member]:
    """Defragment each member (or the one named), one after another (a member answers nothing
    while it defragments: never two at once)."""
    every = await members(endpoint, admin)
    chosen = every if name is None else [_named(every, name)]
    for m in chosen:
        await _maintenance(m, admin, lambda st, t: st.Defragment(rpc_pb2.DefragmentRequest(), timeout=t), timeout)
    return chosen


async def remove(endpoint: str, name: str, admin: EtcdTls | None = None, timeout: float = 10.0) -> Member:
    gone = _named(await members(endpoint, admin, timeout), name)
    await _cluster(endpoint, admin, lambda s, t: s.MemberRemove(rpc_pb2.MemberRemoveRequest(ID=gone.id),
                                                                timeout=t), timeout)
    return gone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controlplane.store.members", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default="127.0.0.1:2379", help="a member's client address HOST:PORT")
    p.add_argument("--ca", help="etcd serves TLS: its CA (PEM)")
    p.add_argument("--cert", help="the admin's client certificate (PEM; common name root once auth is on)")
    p.add_argument("--key", help="its private key (PEM)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the members: id, name, peer and client URLs")
    sub.add_parser("status", help="every member asked at its client URL: leader, follower or unreachable; "
                                  "exit 3 unless all answer and follow one leader")
    ml = sub.add_parser("move-leader", help="hand the leadership to a member (by name or id)")
    ml.add_argument("name")
    d = sub.add_parser("defrag", help="give each member's free pages back to the disk, one at a time (or NAME's)")
    d.add_argument("name", nargs="?")
    a = sub.add_parser("add", help="tell the cluster of a new member; prints the cluster it is to start with")
    a.add_argument("name")
    a.add_argument("peer_url", metavar="PEER_URL", help="https://HOST:2380")
    r = sub.add_parser("remove", help="take a member out of the cluster (by name or id)")
    r.add_argument("name")
    args = p.parse_args(argv)
    def act() -> None:
        admin = EtcdTls.load(args.ca, args.cert, args.key) if args.ca else None
        if args.command == "list":
            for m in asyncio.run(members(args.endpoint, admin)):
                print(f"{m.id:x} {m.name or '(not started)'} peers={','.join(m.peer_urls)} "
                      f"clients={','.join(m.client_urls) or '-'}")
        elif args.command == "status":
            found = asyncio.run(status(args.endpoint, admin))
            for s in found:
                print(s.line)
            if not healthy(found):
                raise Unhealthy("not every member answers and follows one leader")
        elif args.command == "move-leader":
            m = asyncio.run(move_leader(args.endpoint, args.name, admin))
            print(f"leader: {m.id:x} {m.name}")
        elif args.command == "defrag":
            for m in asyncio.run(defrag(args.endpoint, args.name, admin)):
                print(f"defragmented {m.id:x} {m.name}")
        elif args.command == "add":
            print(f"ETCD_INITIAL_CLUSTER={asyncio.run(add(args.endpoint, args.name, args.peer_url, admin))}")
            print("ETCD_INITIAL_CLUSTER_STATE=existing")
        else:
            m = asyncio.run(remove(args.endpoint, args.name, admin))
            print(f"removed {m.id:x} {m.name}")

    try:
        return admin_command("members", args.endpoint, act)
    except Unhealthy as e:
        print(f"members: {e}", file=sys.stderr)
        return 3

if __name__ == "__main__":
    sys.exit(main())
