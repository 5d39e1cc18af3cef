"""Rehearsing failures in a dev region: kill a process, restart it, or cut it off while it keeps
running (partition: iptables DROP rules, so connections go silent as behind a real partition) and
heal it. The Region (region.py) has these as its own methods."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess

from controlplane.devregion.network import ip_binary
from controlplane.devregion.procs import child_env


class Faults:
    """kill, restart, partition and heal for a Region: its processes by name (etcd, controld, an
    agent), its recorded partitions (`partitioned`, saved with the region's state)."""

    partitioned: set[str]

    def _key(self, name: str) -> str:
        if name in ("etcd", "controld"):
            return name
        self._spec(name)
        return f"agent:{name}"

    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int | None:
        """Signal etcd, controld or an agent and wait until it has exited; its data stays."""
        return self._kill(self._key(name), sig, timeout)

    def restart(self, name: str) -> None:
        """Stop it (SIGTERM, SIGKILL after 30 s) if it runs, and start it again, on the same data,
        ports and address; returns once it answers. etcd and controld not while either is cut off:
        etcd's start is judged through its port (which controld's partition cuts too), controld's
        through its API and it reads etcd before it serves. An agent's start is judged on its own
        namespace's loopback, which its partition leaves alone."""
        key = self._key(name)
        cut = {"etcd", "controld"} & self.partitioned if name in ("etcd", "controld") else set()
        if cut:
            raise RuntimeError(f"{name} cannot be restarted while {' and '.join(sorted(cut))} is partitioned: heal first")
        ref = self.procs.get(key)
        if ref is not None and ref.alive():
            self._kill(key, signal.SIGTERM, 30.0)
        if name == "etcd":
            self.start_etcd()
        elif name == "controld":
            self.start_controld()
        else:
            self.start_agent(name)

    def _rules(self, name: str) -> list[tuple[str | None, list[str]]]:
        """The iptables rules that cut `name` off: (the agent's namespace, or None: the host's; rule)."""
        self._key(name)
        assert self._etcd_info is not None and self.controld_listen is not None and self.network is not None
        tag = ["-m", "comment", "--comment", self._tag(name), "-j", "DROP"]
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
