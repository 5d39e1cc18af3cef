"""CPU turbo (boost) frequencies, host-wide.

    [turbo]
    enabled = false   # steady clocks: latency-sensitive tiers trade peak speed for predictability

intel_pstate has `no_turbo` (1 = off) in active and passive mode alike (it caps the P-state
limits either way); acpi-cpufreq and amd-pstate have `cpufreq/boost` (1 = on).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, Mapping

from agent.profiles.appliers.base import Applier, ApplierError, parse_switch
from agent.profiles.model import NotApplicable, Setting

_NO_TURBO = "devices/system/cpu/intel_pstate/no_turbo"
_BOOST = "devices/system/cpu/cpufreq/boost"


class Turbo(Applier):
    name = "turbo"
    order = 40

    def _knob(self) -> tuple[Path, bool] | NotApplicable:
        """The file that switches turbo and whether 1 in it means off; else why there is none."""
        no_turbo, boost = self.ctx.sys / _NO_TURBO, self.ctx.sys / _BOOST
        status_file = no_turbo.parent / "status"
        status = status_file.read_text().strip() if status_file.is_file() else "active"
        off = ""
        if no_turbo.is_file() and status != "off":
            return self._writable(no_turbo, True)
        if no_turbo.is_file():
            # Unregistered intel_pstate answers EAGAIN; another driver may have taken over.
            off = f" ({status_file} says off: intel_pstate is not the scaling driver)"
        if boost.is_file():
            return self._writable(boost, False)
        return NotApplicable(f"no turbo control on this host: neither {no_turbo} nor {boost} exists{off}")

    @staticmethod
    def _writable(path: Path, inverted: bool) -> tuple[Path, bool] | NotApplicable:
        if not path.stat().st_mode & 0o222:
            return NotApplicable(f"{path} is read-only: the driver does not let turbo be switched")
        turbo_pct = path.parent / "turbo_pct"
        if inverted and turbo_pct.is_file() and turbo_pct.read_text().strip() == "0":
            return NotApplicable(f"the processor has no turbo range ({turbo_pct} is 0)")
        return path, inverted

    def parse(self, section: Mapping[str, Any], origin: str) -> list[Setting]:
        return parse_switch(self.name, section, origin)

    def applicable(self, key: str) -> NotApplicable | None:
        knob = self._knob()
        return knob if isinstance(knob, NotApplicable) else None

    def read(self, key: str) -> bool:
        knob = self._knob()
        if isinstance(knob, NotApplicable):
            raise ApplierError(knob.why)
        path, inverted = knob
        return (path.read_text().strip() == "1") != inverted

    def write(self, key: str, value: bool) -> None:
        knob = self._knob()
        if isinstance(knob, NotApplicable):
            raise ApplierError(knob.why)
        path, inverted = knob
        text = "1" if value != inverted else "0"
        try:
            path.write_text(text)
        except OSError as e:
            why = e.strerror
            if e.errno == errno.EPERM:
                why += ": turbo is disabled by the firmware (BIOS) or not supported by this processor"
            raise ApplierError(f"writing {text} to {path}: {why}") from e


APPLIER = Turbo
