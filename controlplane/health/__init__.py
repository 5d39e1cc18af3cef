"""The health check service (paper 2.1): a machine whose agent falls silent is failed, with an
unavailability event, and its tasks move (check.py); a task moved off a machine the control plane
could not see stays there as a tombstone until its agent reports it gone (tombstones.py)."""
