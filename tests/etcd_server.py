"""A real etcd (Debian's etcd-server) on free loopback ports with a temporary data dir.

The class lives in `controlplane/etcdproc.py` (the local dev region uses it too)."""

from controlplane.etcdproc import EtcdServer, free_port

_free_port = free_port

__all__ = ["EtcdServer"]
