"""Usage (issue #25): what tasks and machines use, as their agents measure it (agent/usage.py),
held by the replica their heartbeats reach, summed per job and per fleet cell."""
