"""A real etcd (Debian's etcd-server) on free loopback ports with a temporary data dir.

The class lives in `controlplane/store/etcdproc.py` (the local dev region uses it too)."""

import asyncio
from pathlib import Path

from controlplane.store.etcdproc import EtcdServer, free_port

_free_port = free_port

__all__ = ["EtcdServer", "read_as"]


def kv_as(endpoint: str, ca: str | Path, pair, key: bytes, value: bytes | None = None) -> list[bytes] | str:
    """As the user of the client certificate `pair` (.cert, .key), over etcd's gRPC API (its JSON
    gateway ignores a certificate's user): put `value` at `key` when given, else read `key`. Returns
    the values read ([] for a put), or the name of the gRPC status etcd refused it with."""
    import grpc
    from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

    from controlplane.store.etcdtls import EtcdTls

    async def call() -> list[bytes] | str:
        creds = EtcdTls.load(str(ca), str(pair.cert), str(pair.key)).credentials()
        async with grpc.aio.secure_channel(endpoint, creds) as channel:
            kv = rpc_pb2_grpc.KVStub(channel)
            try:
                if value is not None:
                    await kv.Put(rpc_pb2.PutRequest(key=key, value=value), timeout=10)
                    return []
                return [x.value for x in (await kv.Range(rpc_pb2.RangeRequest(key=key), timeout=10)).kvs]
            except grpc.aio.AioRpcError as e:
                return e.code().name

    return asyncio.run(call())


def read_as(endpoint: str, ca: str | Path, pair, key: bytes) -> str:
    """A range read of `key` as the user of the client certificate `pair`: "ok", or the name of the
    gRPC status etcd refused it with."""
    got = kv_as(endpoint, ca, pair, key)
    return got if isinstance(got, str) else "ok"
