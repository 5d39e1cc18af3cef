"""The control plane's only durable state: etcd, through the aetcd asyncio client.

Every durable change is one transaction guarded by the mod revisions of what it read; in-memory
indexes are caches built by a range read and kept current by a watch.
"""

from controlplane.store.etcd import Conflict, Store, Versioned
from controlplane.store.index import Index

__all__ = ["Store", "Versioned", "Conflict", "Index"]
