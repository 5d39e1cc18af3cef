"""How the store reaches an etcd that serves TLS: the CA, this client's certificate and key, and
aetcd's client over a TLS channel (aetcd opens only plain ones)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any, Callable

import aetcd
import grpc

from agent.errors import InputError


@dataclass(frozen=True)
class EtcdTls:
    """How the store reaches an etcd that serves TLS: the CA its certificate chains to, and this
    client's certificate and key (etcd's --client-cert-auth: the certificate is the credential,
    its common name the user when etcd's auth is on). PEM bytes, read once at start."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def load(cls, ca: str, cert: str | None, key: str | None) -> "EtcdTls":
        """From files; InputError names the flag and the file that cannot be used."""
        if (cert is None) != (key is None):
            raise InputError("command line", "--etcd-cert/--etcd-key", f"{cert} / {key}", "give both or neither")
        out = []
        for flag, path in (("--etcd-ca", ca), ("--etcd-cert", cert), ("--etcd-key", key)):
            if path is None:
                out.append(None)
                continue
            try:
                data = open(path, "rb").read(1024 * 1024)
            except OSError as e:
                raise InputError("command line", flag, path, e.strerror or str(e)) from None
            if b"-----BEGIN " not in data:
                raise InputError("command line", flag, path, "not a PEM file")
            out.append(data)
        return cls(*out)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)


class TlsClient(aetcd.Client):
    """aetcd's client over a TLS channel: aetcd opens only plain ones. The same connection set-up
    as aetcd.Client.connect (stubs, watcher), on grpc's secure channel."""

    def __init__(self, *args: Any, tls: EtcdTls, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._tls = tls

    @aetcd.client._handle_errors
    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            self.channel = aetcd.rpc.secure_channel(f"{self._host}:{self._port}", self._tls.credentials(),
                                                    options=self._options.items())
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(aetcd.rpc.WatchStub(self.channel), timeout=self._timeout,
                                                  metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False


def admin_command(prog: str, endpoint: str, act: Callable[[], None]) -> int:
    """An etcd admin command's exit code (controlplane.store.members, controlplane.security.etcdauth):
    0 when `act` ran, 2 for input it could not use (named), 3 when etcd refused (its words)."""
    try:
        act()
    except InputError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as e:
        print(f"{prog}: etcd at {endpoint}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 3
    return 0
