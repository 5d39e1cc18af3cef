"""Host-profile rollouts (issue #28): an entitlement's profile change reaches its machines in batches."""
