"""twine-controld and twinectl: the regional control plane (built on etcd)."""
