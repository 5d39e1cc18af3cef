"""etcd's own access control for a region's etcd: its auth, with roles.

An etcd started with `--client-cert-auth` takes only clients whose certificate its CA signed; with
its auth on, it also takes a certificate's common name as the user, and a user may do only what its
roles allow. `enable()` sets that up, as `etcdctl user add` / `role add` / `auth enable` would
(etcdctl is not among etcd-server's files), over the client API with the admin's certificate:

- user `root` (the admin's certificate's common name), role `root`: etcd's administrator;
- the control plane's user (its client certificate's common name), role `twine`: read and write
  under the key prefix `/twine` (the region's records, and the store's probe key), nothing else;
- then auth on. Any other certificate the CA signed is refused every key.

Users have no password (`no_password`): the certificate is the credential. Running it again on an
etcd already set up changes nothing (etcd keeps users, roles and auth in its data).

    python -m controlplane.security.etcdauth --endpoint 127.0.0.1:2379 --ca CA --cert ROOT.pem --key ROOT-key.pem \\
        --user CONTROLD_CN

Exit codes: 0 done, 2 bad input (a file, a name), 3 etcd unreachable or refusing the admin.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import grpc
from aetcd.rpc import auth_pb2, rpc_pb2, rpc_pb2_grpc

from controlplane.store.records import InputError
from controlplane.store.etcdtls import EtcdTls, admin_command

ROLE = "twine"
PREFIX = b"/twine"  # the region's records (/twine/REGION/...) and the store's probe key (/twine-probe)


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for every key starting with `prefix` (its last byte plus one)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        raise ValueError("a prefix of 0xff bytes has no range end")
    return p[:-1] + bytes([p[-1] + 1])


async def enable(endpoint: str, admin: EtcdTls, user: str, prefix: bytes = PREFIX, timeout: float = 10.0) -> list[str]:
    """Set up users `root` and `user`, role `twine` (read and write under `prefix`) and turn auth on,
    on the etcd at `endpoint` (HOST:PORT), as the admin (a client certificate whose common name is
    root). Returns what it did, a line each; what was there already is left as it is."""
    if not user or user == "root":
        raise InputError("command line", "--user", user, "the control plane's user: not empty, not root")
    done: list[str] = []
    async with grpc.aio.secure_channel(endpoint, admin.credentials()) as channel:
        auth = rpc_pb2_grpc.AuthStub(channel)

        async def step(what: str, call) -> None:
            try:
                await call(timeout=timeout)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION and "already" in (e.details() or ""):
                    return  # there from an earlier run
                raise
            done.append(what)

        async def grant(name: str, role: str) -> None:
            got = await auth.UserGet(rpc_pb2.AuthUserGetRequest(name=name), timeout=timeout)
            if role not in got.roles:
                await step(f"user {name} granted role {role}", lambda **kw: auth.UserGrantRole(
                    rpc_pb2.AuthUserGrantRoleRequest(user=name, role=role), **kw))

        no_password = auth_pb2.UserAddOptions(no_password=True)
        await step("user root added", lambda **kw: auth.UserAdd(
            rpc_pb2.AuthUserAddRequest(name="root", options=no_password), **kw))
        await step("role root added", lambda **kw: auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), **kw))
        await grant("root", "root")
        await step(f"user {user} added", lambda **kw: auth.UserAdd(
            rpc_pb2.AuthUserAddRequest(name=user, options=no_password), **kw))
        await step(f"role {ROLE} added", lambda **kw: auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name=ROLE), **kw))
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=prefix, range_end=prefix_end(prefix))
        role = await auth.RoleGet(rpc_pb2.AuthRoleGetRequest(role=ROLE), timeout=timeout)
        if not any((p.permType, p.key, p.range_end) == (perm.permType, perm.key, perm.range_end) for p in role.perm):
            await step(f"role {ROLE} may read and write {prefix.decode(errors='replace')}*",
                       lambda **kw: auth.RoleGrantPermission(
                           rpc_pb2.AuthRoleGrantPermissionRequest(name=ROLE, perm=perm), **kw))
        await grant(user, ROLE)
        # auth on: once it is, only root may change users and roles (the steps above, run again)
        await auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=timeout)
        done.append("auth enabled (a no-op when it was)")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controlplane.security.etcdauth",
                                description="Turn on etcd's auth: users root and --user, role twine (/twine*).")
    p.add_argument("--endpoint", default="127.0.0.1:2379", help="etcd's client address HOST:PORT")
    p.add_argument("--ca", required=True, help="the CA etcd's certificate chains to (PEM)")
    p.add_argument("--cert", required=True, help="the admin's client certificate (PEM; its common name: root)")
    p.add_argument("--key", required=True, help="the admin's private key (PEM)")
    p.add_argument("--user", required=True, help="the control plane's user: its etcd client certificate's common name")
    args = p.parse_args(argv)
    def act() -> None:
        admin = EtcdTls.load(args.ca, args.cert, args.key)
        for line in asyncio.run(enable(args.endpoint, admin, args.user)):
            print(f"etcdauth: {line}")

    return admin_command("etcdauth", args.endpoint, act)

if __name__ == "__main__":
    sys.exit(main())
