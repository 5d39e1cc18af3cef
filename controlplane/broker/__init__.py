"""The resource broker: machines register through their agents (labels, capacity, credential),
long-poll their desired state and heartbeat their task reports. A machine is free or belongs to one
entitlement; the scheduler's transactions move it between them (see scheduler/service.py)."""
