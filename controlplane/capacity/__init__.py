"""Opportunistic capacity (issue #37): machines the region does not need now run the jobs of
opportunistic entitlements, and are taken back, with notice, when a guaranteed entitlement needs
them (reclaim.py)."""
