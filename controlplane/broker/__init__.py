"""The resource broker (paper 2.1, 3.3): the region's machines and their agents. Machines register
through their agents (labels, capacity, credential), long-poll their desired state and heartbeat
their task reports (agents.py); a clean reboot is planned unavailability (reboots.py); what one
replica hears reaches the others (relay.py). A machine is free or belongs to one entitlement: the
free pool's rule is pool.py's, and the scheduler's transactions move machines between them."""
