"""Which CPUs service which interrupts: IRQs chosen by a regex over /proc/interrupts.

    [irq_affinity]
    nic-queues = { match = 'virtio[0-9]+-(input|output)\\.[0-9]+', cpus = "0-1" }

The key is "<rule>=<regex>": read() must find the IRQs from the key alone (the engine reads
settings of an old profile that nothing parsed). write() takes two value forms:
  desired  {"match": regex, "cpus": "0-1"}               one CPU list for every matching IRQ
  saved    {"match": regex, "irqs": {"38": "0-1", ...}}  what read() returns, so that a rollback
                                                         restores each IRQ's own list exactly.
irqbalance moves IRQs back within seconds: while it runs, write() refuses (the profile should
say `[irqbalance] running = false`), and verify() names it when it finds an IRQ moved.
The kernel refuses (EPERM/EIO) to move managed interrupts, which their driver spreads itself:
the write fails naming every such IRQ and the profile rolls back rather than half-apply. IRQs
already at the wanted list are not written, so a rollback never trips over them.
"""

from __future__ import annotations

import errno
import re
import time
from itertools import groupby
from typing import Any, Mapping

from agent.errors import ProfileError
from agent.profiles.appliers.base import Applier, ApplierError
from agent.profiles.model import Differs, Holds, NotApplicable, Setting, Verdict

_RULE = re.compile(r"^[A-Za-z0-9_.-]+$")
_TRIGGER = re.compile(r"(edge|level|fasteoi)$")  # the column before the action names


MAX_CPU = 8191  # the kernel's NR_CPUS is at most 8192


def parse_cpus(spec: str | list) -> set[int]:
    """A CPU list, "0-3,8" or [0, 1, 2, 3, 8], as a set. ValueError when malformed."""
    if isinstance(spec, list):
        if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_CPU for c in spec):
            raise ValueError(f"a CPU list holds CPU numbers from 0 to {MAX_CPU}")
        return set(spec)
    cpus: set[int] = set()
    for part in str(spec).strip().split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"range {part} runs backwards")
        if first < 0 or last > MAX_CPU:  # checked before the range is made: "0-100000000" ran out of memory
            raise ValueError(f"range {part} is beyond CPU {MAX_CPU}, the kernel's largest")
        cpus.update(range(first, last + 1))
    return cpus


def format_cpus(cpus: set[int]) -> str:
    """{0, 1, 4} -> "0-1,4", the kernel's own form."""
    runs = [[c for _, c in run] for _, run in groupby(enumerate(sorted(cpus)), lambda p: p[1] - p[0])]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


class IrqAffinity(Applier):
    name = "irq_affinity"
    order = 50

    # Without interrupt remapping the kernel moves an IRQ when it next fires, and it may fire on
    # its old CPU a few more times first (measured in a VM: twice, over 0.6 s). verify() gives a
    # firing IRQ this long to move before it calls it misplaced; one quiet this long is delivered
    # nowhere while its move waits.
    settle_seconds = 2.0
    quiet_seconds = 0.25

    def __init__(self, ctx):
        super().__init__(ctx)
        self._refused: dict[int, str] = {}  # IRQ -> why the kernel refused to move it

    def _interrupts(self) -> dict[int, tuple[str, str, int]]:
        """IRQ -> (text after the per-CPU counts, action names, total count)."""
        lines = (self.ctx.proc / "interrupts").read_text().splitlines()
        ncpu = len(lines[0].split())
        out = {}
        for line in lines[1:]:
            head, _, rest = line.partition(":")
            if not head.strip().isdigit():
                continue  # NMI, LOC, ...: per-CPU events, not routable IRQs
            fields = rest.split()
            counts = [int(f) for f in fields[:ncpu] if f.isdigit()]
            desc = fields[len(counts):]
            cut = max((i + 1 for i, f in enumerate(desc) if _TRIGGER.search(f)), default=len(desc) - 1)
            out[int(head)] = (" ".join(desc), " ".join(desc[cut:]), sum(counts))
        return out

    def _matching(self, match: str) -> dict[int, tuple[str, str, int]]:
        rx = re.compile(match)
        return {
            n: irq for n, irq in self._interrupts().items()
            if rx.search(irq[0]) or any(rx.search(a.strip()) for a in irq[1].split(","))
        }

    def _affinity(self, n: int, kind: str = "smp_affinity_list") -> set[int] | None:  # None: no such file
        path = self.ctx.proc / "irq" / str(n) / kind
        return parse_cpus(path.read_text()) if path.is_file() else None

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        online = parse_cpus((self.ctx.sys / "devices/system/cpu/online").read_text())
        settings = []
        for rule, value in section.items():
            field = f"[irq_affinity] {rule}"
            if not _RULE.fullmatch(str(rule)):
                raise ProfileError(origin, field, value, "a rule name has letters, digits, '_', '.', '-' only")
            if not isinstance(value, dict) or set(value) != {"match", "cpus"}:
                raise ProfileError(origin, field, value, 'must be a table { match = "<regex>", cpus = "0-3" }')
            match = value["match"]
            if not isinstance(match, str) or not match:
                raise ProfileError(origin, field, match, "match must be a non-empty regular expression")
            try:
                re.compile(match)
            except re.error as e:
                raise ProfileError(origin, field, match, f"match is not a regular expression: {e}") from None
            try:
                cpus = parse_cpus(value["cpus"])
            except (ValueError, TypeError) as e:
                raise ProfileError(origin, field, value["cpus"], f'cpus is not a CPU list like "0-3,8": {e}') from None
            if not cpus or not cpus <= online:
                missing = format_cpus(cpus - online) or "none given"
                raise ProfileError(origin, field, value["cpus"], f"CPUs not online here: {missing} (online: {format_cpus(online)})")
            settings.append(Setting(self.name, f"{rule}={match}", {"match": match, "cpus": format_cpus(cpus)}, origin))
        return settings

    def check(self, settings: list[Setting]) -> None:
        owner: dict[int, Setting] = {}  # two rules pinning one IRQ differently would fight
        for s in settings:
            for n, (_, names, _) in self._matching(s.value["match"]).items():
                other = owner.setdefault(n, s)
                if other.value["cpus"] != s.value["cpus"]:
                    raise ProfileError(
                        s.origin, f"[irq_affinity] {s.key.split('=')[0]}", s.value,
                        f"IRQ {n} ({names}) is also matched by rule {other.key.split('=')[0]} with cpus {other.value['cpus']}",
                    )

    def applicable(self, key: str) -> NotApplicable | None:
        match = key.split("=", 1)[1]
        if not self._matching(match):
            return NotApplicable(f"no interrupt matches {match!r} in {self.ctx.proc / 'interrupts'}")
        return None

    def read(self, key: str) -> dict:
        match = key.split("=", 1)[1]
        irqs = {str(n): format_cpus(self._affinity(n) or set()) for n in self._matching(match)}
        return {"match": match, "irqs": irqs}

    def _targets(self, value: dict) -> dict[int, set[int]]:
        if "irqs" in value:  # saved form; an IRQ that went away with its device has nothing to restore
            return {int(n): parse_cpus(c) for n, c in value["irqs"].items() if (self.ctx.proc / "irq" / n).is_dir()}
        cpus = parse_cpus(value["cpus"])
        return {n: cpus for n in self._matching(value["match"])}

    def _irqbalance(self) -> str:
        from agent.profiles.appliers.irqbalance import irqbalance_pids

        pids = irqbalance_pids()
        if not pids:
            return ""
        return (f"irqbalance is running (pid {', '.join(map(str, pids))}) and moves pinned IRQs back: "
                "add `[irqbalance] running = false` to the profile, or stop it on this host")

    def write(self, key: str, value: dict) -> None:
        if "cpus" in value and (conflict := self._irqbalance()):
            raise ApplierError(conflict)
        irqs = self._interrupts()
        problems = []
        for n, cpus in self._targets(value).items():
            if self._affinity(n) == cpus:
                continue
            path = self.ctx.proc / "irq" / str(n) / "smp_affinity_list"
            try:
                path.write_text(format_cpus(cpus))
            except OSError as e:
                why = f"writing {format_cpus(cpus)} to {path}: {e.strerror}"
                if e.errno in (errno.EPERM, errno.EIO):  # managed interrupt: its driver spreads it
                    why = self._refused[n] = f"the kernel refuses to move it ({e.strerror}); leave it out of the match"
                problems.append(f"IRQ {n} ({irqs.get(n, ('', '?', 0))[1]}): {why}")
        if problems:
            raise ApplierError("; ".join(problems))

    def _listed(self, targets: dict[int, set[int]]) -> dict[int, set[int] | None]:
        """The IRQs' smp_affinity_list once each reads as its target, or as they read after
        settle_seconds: a list just written may read back as the old one until the kernel has
        made the move (seen on this kind of VM: "0-1" written over "0" read back "0" at once)."""
        start = time.monotonic()
        while True:
            lists = {n: self._affinity(n) for n in targets}
            if all(lists[n] == cpus or n in self._refused for n, cpus in targets.items()) \
                    or time.monotonic() - start >= self.settle_seconds:
                return lists
            time.sleep(0.05)

    def _still_delivered_outside(self, n: int, cpus: set[int]) -> set[int] | None:
        """The CPUs outside `cpus` that IRQ n is still delivered to once a pending move had time to
        happen; None when it settles inside them, or goes quiet (delivered nowhere meanwhile)."""
        start = time.monotonic()
        fired, last_fired = self._interrupts().get(n, ("", "", 0))[2], start
        while True:
            effective = self._affinity(n, "effective_affinity_list")
            if effective is None or effective <= cpus:
                return None
            now, count = time.monotonic(), self._interrupts().get(n, ("", "", 0))[2]
            if count != fired:
                fired, last_fired = count, now
            if now - last_fired >= self.quiet_seconds:
                return None
            if now - start >= self.settle_seconds:
                return effective
            time.sleep(0.05)

    def verify(self, key: str, value: dict) -> Verdict:
        irqs = self._interrupts()
        problems = []
        targets = self._targets(value)
        lists = self._listed(targets)
        for n, cpus in targets.items():
            names = irqs.get(n, ("", "?", 0))[1]
            have = lists[n]
            if have != cpus:
                why = f"; {self._refused[n]}" if n in self._refused else ""
                problems.append(f"IRQ {n} ({names}) has smp_affinity_list {format_cpus(have or set())}, wanted {format_cpus(cpus)}{why}")
                continue
            if outside := self._still_delivered_outside(n, cpus):
                problems.append(
                    f"IRQ {n} ({names}) is still delivered to CPU {format_cpus(outside)} (effective_affinity_list), "
                    f"outside {format_cpus(cpus)}, {self.settle_seconds:g} s after its list was set"
                )
            elif (after := self._affinity(n)) != cpus:  # a pending move the kernel gave up when it fired
                problems.append(f"IRQ {n} ({names}) went back to smp_affinity_list {format_cpus(after or set())} "
                                f"after {format_cpus(cpus)} was set: the kernel did not complete the move")
        if problems:
            if conflict := self._irqbalance():
                problems.append(conflict)
            return Differs(self.read(key), "; ".join(problems))
        return Holds()


APPLIER = IrqAffinity
