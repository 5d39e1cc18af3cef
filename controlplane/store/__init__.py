"""The control plane's only durable state: etcd, through the aetcd asyncio client.

Every durable change is one transaction guarded by the mod revisions of what it read; in-memory
indexes are caches built by a range read and kept current by a watch.
"""

from controlplane.store.etcd import (ETCD_FLAGS, Change, Conflict, EtcdTls, Revision, Store, TooLarge, Unavailable,
                                     Versioned)
from controlplane.store.index import Index

__all__ = ["Store", "Versioned", "Conflict", "TooLarge", "Unavailable", "Index", "ETCD_FLAGS", "Revision", "EtcdTls",
           "Change"]
