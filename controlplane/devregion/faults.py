"""Rehearsing failures in a dev region: kill a process, restart it, or cut it off while it keeps
running (partition: iptables DROP rules, so connections go silent as behind a real partition) and
heal it. The Region (region.py) has these as its own methods."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess

from controlplane.devregion.layout import is_etcd_member
from controlplane.devregion.network import ip_binary
from controlplane.devregion.procs import child_env


class Faults:
    """kill, restart, partition and heal for a Region: its processes by name (etcd, controld, an
    agent), its recorded partitions (`partitioned`, saved with the region's state)."""

    partitioned: set[str]
    etcd_members: int

    def resolve(self, name: str) -> str:
        """`etcd-leader`: the etcd member that leads now (`etcd-N`); any other name as it is."""
        return self.etcd_leader() if name == "etcd-leader" and self.etcd_members > 1 else name

    def _key(self, name: str) -> str:
        if name in ("etcd", "controld"):
            return name
        if is_etcd_member(name):
            if name not in self.etcd_names():
                raise KeyError(f"no etcd member {name!r} in this region (members: {', '.join(self.etcd_names())})")
            return name
        self._spec(name)
        return f"agent:{name}"

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int | None:
        """Signal etcd (every member), an etcd member, controld or an agent and wait until it has
        exited; its data stays."""
        name = self.resolve(name)
        if name == "etcd":
            return self.kill_etcd(sig, timeout)
        return self._kill(self._key(name), sig, timeout)

    def msb_agents(self, msb: str) -> list[str]:
        """The agents of one MSB (their spec's label), by name; KeyError naming the MSBs if none."""
        names = sorted(n for n, s in self.specs.items() if s.msb == msb)
        if not names:
            raise KeyError(f"no agent in msb {msb!r} (msbs: {', '.join(sorted({s.msb for s in self.specs.values()}))})")
        return names

    def kill_msb(self, msb: str) -> list[str]:
        """An MSB lost: every agent of it SIGKILLed at once (signalled together, then waited for);
        their machines go silent together. Returns their names."""
        names = self.msb_agents(msb)
        for n in names:
            ref = self.procs.get(f"agent:{n}")
            if ref is not None and (p := ref.process()) is not None:
                p.send_signal(signal.SIGKILL)
        for n in names:
            self._kill(f"agent:{n}", signal.SIGKILL, 30.0)
        return names

    def heal_msb(self, msb: str) -> list[str]:
        """The MSB back: each of its agents started again (on its data: its machine answers again)."""
        names = self.msb_agents(msb)
        for n in names:
            self.restart(n)
        return names

    def restart(self, name: str) -> None:
        """Stop it (SIGTERM, SIGKILL after 30 s) if it runs, and start it again, on the same data,
        ports and address; returns once it answers. etcd and controld not while either is cut off:
        etcd's start is judged through its port (which controld's partition cuts too), controld's
        through its API and it reads etcd before it serves. An agent's start is judged on its own
        namespace's loopback, which its partition leaves alone."""
        name = self.resolve(name)
        key = self._key(name)
        stores = {"etcd", "controld", *self.etcd_names()}
        cut = ({"etcd", "controld", name} & self.partitioned) if name in stores else set()
        if cut:
            raise RuntimeError(f"{name} cannot be restarted while {' and '.join(sorted(cut))} is partitioned: heal first")
        for k in (self.etcd_names() if name == "etcd" else [key]):
            ref = self.procs.get(k)
            if ref is not None and ref.alive():
                self._kill(k, signal.SIGTERM, 30.0)
        if name == "etcd" or is_etcd_member(name):
            self.start_etcd(name)
        elif name == "controld":
            self.start_controld()
        else:
            self.start_agent(name)

    def _rules(self, name: str) -> list[tuple[str | None, list[str]]]:
        """The iptables rules that cut `name` off: (the agent's namespace, or None: the host's; rule).
        An etcd member of a cluster: whatever its processes send (matched by its cgroup: its
        connections to its peers leave from 127.0.0.1 like anyone's), and whatever comes to its
        address; the whole cluster (`etcd`): every member from controld and from each other."""
        self._key(name)
        assert self._etcd_info is not None and self.controld_listen is not None and self.network is not None
        tag = ["-m", "comment", "--comment", self._tag(name), "-j", "DROP"]
        if is_etcd_member(name):
            host = self._member(name)["host"]
            cgroup = self._member(name)["cgroup"].rsplit("/", 1)[-1]  # relative to the cgroup v2 root
            return [(None, ["OUTPUT", "-m", "cgroup", "--path", cgroup, *tag]),
                    (None, ["INPUT", "-i", "lo", "-d", host, *tag])]
        if name == "etcd" and self.etcd_members > 1:
            return [(None, ["INPUT", "-i", "lo", "-d", m["host"], *tag]) for m in self._etcd_info["members"]]
        if name in ("etcd", "controld"):
            etcd = str(self._etcd_info["port"])  # controld is etcd's only client
            rules = [["INPUT", "-i", "lo", "-p", "tcp", "--dport", etcd, *tag],
                     ["OUTPUT", "-o", "lo", "-p", "tcp", "--sport", etcd, *tag]]
            if name == "controld":
                host, port = self.controld_listen.rsplit(":", 1)
                rules += [["INPUT", "-d", host, "-p", "tcp", "--dport", port, *tag],
                          ["OUTPUT", "-s", host, "-p", "tcp", "--sport", port, *tag]]
            return [(None, r) for r in rules]
        ns, bridge = self.netns(name), self.network.bridge_ip
        return [(ns, ["OUTPUT", "-d", bridge, *tag]), (ns, ["INPUT", "-s", bridge, *tag])]

    def _tag(self, name: str) -> str:
        """The comment every rule of partition(name) carries: how heal() finds them."""
        return f"twine-devregion-{self.prefix}-{name}"

    def _iptables(self, ns: str | None, *args: str) -> subprocess.CompletedProcess:
        argv = [shutil.which("iptables") or "/usr/sbin/iptables", "-w", "5", *args]
        if ns is not None:
            argv = [ip_binary(), "netns", "exec", ns, *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=child_env())

    def partition(self, name: str) -> None:
        """Cut `name` off while it keeps running: its connections go silent (DROP, not refused)."""
        name = self.resolve(name)
        rules = self._rules(name)  # an unknown name is refused before anything is recorded
        if name in self.partitioned:
            return
        self.partitioned.add(name)
        self.save()  # recorded before the rules exist: heal() and down remove them whatever happens
        for ns, rule in rules:
            try:
                r = self._iptables(ns, "-I", *rule)
                why = r.stderr.strip() if r.returncode != 0 else ""
            except (OSError, subprocess.TimeoutExpired) as e:
                why = str(e)
            if why:  # half-way: take back what was put
                problems = self.heal(name)
                raise RuntimeError(f"partition {name}: iptables -I {' '.join(rule)}: {why}"
                                   + (f"; and healing it: {'; '.join(problems)}" if problems else ""))

    def heal(self, name: str | None = None) -> list[str]:
        """Remove every rule of partition(`name`) (None: of every partition), found by its comment
        in the chains where it was put (not rebuilt from the region's state, nor judged by
        iptables' error words); a name stays recorded until none of its rules is left. Returns the
        problems met."""
        problems = []
        names = sorted(self.partitioned) if name is None else [name]
        # once, and only with something to heal: it lists every link and namespace
        namespaces = self.network.leftovers()["netns"] if names and self.network is not None else []
        for n in names:
            tag = self._tag(n)
            left = 0
            for ns in {ns for ns, _ in self._rules(n)}:  # _rules refuses an unknown name
                if ns is not None and ns not in namespaces:
                    continue  # its namespace is gone, and its rules with it
                try:
                    listed = self._iptables(ns, "-S")
                    if listed.returncode != 0:
                        raise RuntimeError(listed.stderr.strip())
                    for line in listed.stdout.splitlines():
                        words = shlex.split(line)  # "-A CHAIN ...": deleted by the same words after -D
                        if words[:1] != ["-A"] or tag not in words:
                            continue
                        r = self._iptables(ns, "-D", *words[1:])
                        if r.returncode != 0:
                            left += 1
                            problems.append(f"heal {n}: iptables -D {' '.join(words[1:])}: {r.stderr.strip()}")
                except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
                    left += 1
                    problems.append(f"heal {n}: listing the rules{f' in netns {ns}' if ns else ''}: {e}")
            if not left:
                self.partitioned.discard(n)
        self.save()
        return problems
