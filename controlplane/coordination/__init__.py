"""How the replicas of the control plane share the work (paper 3.1, 4): membership and shard
leadership through etcd leases, every leader's write fenced by its lease, and the health check's
machines shared out by rendezvous hashing (coordinator.py)."""
