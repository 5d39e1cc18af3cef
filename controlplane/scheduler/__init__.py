"""The scheduler (paper 3.1): one Scheduler a shard, run by the shard's leader (service.py: observe,
decide, act for each job), its pure reconciler (reconcile.py), its transactions (txn.py, writer.py),
its group-committed creates (creates.py), its destructive rate limits (ratelimit.py) and its
lifecycle metrics (lifecycle.py). Placement itself is the allocator's (controlplane/allocator/)."""
