"""A local test region on this one machine: etcd, one `twine-controld`, and N agents, each agent in
its own network namespace. Used by the README demo and by the end-to-end tests.

    python -m controlplane.devregion up --dir /tmp/region [--kernel-owner m1] [--etcd-members 3]
    python -m controlplane.devregion status --dir /tmp/region
    python -m controlplane.devregion kill|restart|partition|heal NAME --dir /tmp/region
    python -m controlplane.devregion kill|heal msb NAME --dir /tmp/region     # every agent of an MSB at once
    python -m controlplane.devregion down --dir /tmp/region

With `--etcd-members 3` (or 5), etcd is a cluster: its members `etcd-1` ... on 127.0.0.11 ...,
TLS to clients and peers, each in a cgroup of its own; controld is given every member.

NAME is `etcd` (in a cluster: every member), `etcd-N` (one member), `etcd-leader` (the member that
leads when the command runs), `controld` or an agent's name. To rehearse failures:
- `kill` SIGKILLs it (`--signal TERM` for a clean stop); its data and state stay (etcd's too).
- `restart` stops it (SIGTERM) if it runs and starts it again, on the same data, ports, address.
- `partition` cuts it off while it keeps running (iptables DROP rules, so connections go silent
  as behind a real partition, not refused): an agent from controld (a rule in its own namespace:
  its containers keep running); etcd from controld (its client port on loopback); an etcd member
  from controld and from its peers (all its sockets send nothing, matched by its cgroup, and
  nothing reaches its address); controld from everything (its API port on the bridge, and etcd).
  `heal` removes the rules (no NAME: all); `down` removes any left.

or, in Python::

    with Region(tmp, [AgentSpec("m1", "dc1", "msb1", "rack1")]) as r:
        print(r.twinectl("machine", "list").stdout)

Network (everything named with a short random prefix `twXXXX`, unique per region):

    host ── bridge `twXXXX-br`, 10.250.K.1/24 (controld listens here; K: the first /24 of
      │     10.250.0.0/16 not routed on this host)
      ├── veth `twXXXX-h0` ══ `eth0` in netns `twXXXX-m1`, 10.250.K.10/24, lo up
      └── veth `twXXXX-h1` ══ `eth0` in netns `twXXXX-m2`, 10.250.K.11/24, lo up

A namespace has only its connected /24 (no default route), so it can reach the bridge address and
nothing beyond; bridge ports are isolated (namespaces cannot reach each other); the bridge and the
host ends do not forward (`net.ipv4.conf.<if>.forwarding=0`, whatever the host's ip_forward says)
and have IPv6 off; no NAT is set up. etcd stays on loopback: only controld (on the host) uses it.

The package: `procs` (starting, recording and stopping processes), `network` (the bridge and the
namespaces), `spec` (an agent's AgentSpec), `region` (the Region: etcd, controld, agents), `layout` (its
paths and names), `etcd` (its etcd: one member or a cluster), `faults` (kill, restart, partition,
heal), `cli`.

Processes are started in their own session (setsid), logged to `DIR/logs/`, and recorded by PID
and start time in `DIR/region.json`, which is rewritten on every change: `down` (or
`Region.from_dir(DIR).stop()`) tears down everything from that file, also after the launcher died.
"""

from controlplane.devregion.network import (FIRST_HOST, MAX_AGENTS, NAME_RE, SUBNET_POOL, Network, NsInfo, in_netns,
                                            ns_http_get, ns_socket)
from controlplane.devregion.procs import REPO, ProcRef, child_env, log_tail, spawn, stop_process
from controlplane.devregion.layout import STATE_FILE
from controlplane.devregion.region import AGENT_LISTEN, CONTROLD_PORT, JOB_LABEL, MACHINE_LABEL, Region
from controlplane.devregion.spec import DEFAULT_AGENTS, AgentSpec, default_agents

__all__ = [
    "AGENT_LISTEN", "CONTROLD_PORT", "DEFAULT_AGENTS", "FIRST_HOST", "JOB_LABEL", "MACHINE_LABEL", "MAX_AGENTS", "NAME_RE",
    "REPO", "STATE_FILE", "SUBNET_POOL", "AgentSpec", "Network", "NsInfo", "ProcRef", "Region", "child_env",
    "default_agents", "in_netns", "log_tail", "ns_http_get", "ns_socket", "spawn", "stop_process",
]
