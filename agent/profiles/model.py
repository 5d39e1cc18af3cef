"""Domain values of host profiles: settings, verdicts, per-setting results, reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# A setting's value as stored in the journal: anything JSON can hold.
Value = Any


@dataclass(frozen=True)
class Setting:
    """One knob of one applier with the value a profile wants for it."""

    applier: str  # section name, e.g. "sysctl"
    key: str  # applier-specific key, e.g. "net.core.somaxconn"
    value: Value  # desired value, already normalised by the applier
    origin: str = ""  # "profiles/web.toml [sysctl]": where it was declared, for messages

    @property
    def id(self) -> str:
        return f"{self.applier}:{self.key}"


class Holds:
    """Verify answer: the setting holds."""

    def __repr__(self) -> str:
        return "Holds()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Holds)


@dataclass(frozen=True)
class Differs:
    """Verify answer: the setting does not hold; `why` says what is there instead."""

    actual: Value
    why: str


@dataclass(frozen=True)
class NotApplicable:
    """Verify/apply answer: this host cannot have this setting (no driver, shared kernel...)."""

    why: str


Verdict = Holds | Differs | NotApplicable


class Outcome(str, enum.Enum):
    APPLIED = "applied"
    HELD = "already held"  # apply found the value already there and wrote nothing
    HOLDS = "holds"  # verify: the host has the value
    NOT_APPLICABLE = "not applicable"
    FAILED = "failed"
    ROLLED_BACK = "rolled back"  # applied, then undone because another setting failed
    RESTORED = "restored"  # a setting of the previous profile put back to its original


@dataclass(frozen=True)
class SettingResult:
    setting_id: str
    outcome: Outcome
    desired: Value = None
    before: Value = None
    after: Value = None
    reason: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "setting": self.setting_id,
            "outcome": self.outcome.value,
            "desired": self.desired,
            "before": self.before,
            "after": self.after,
            "reason": self.reason,
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True)
class PlannedSetting:
    """One line of a diff: what a profile switch would do to one setting."""

    setting: Setting
    current: Value
    action: str  # "change", "hold", "not applicable", "restore"
    reason: str = ""

    def to_json(self) -> dict:
        return {
            "setting": self.setting.id,
            "current": self.current,
            "desired": self.setting.value,
            "action": self.action,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Report:
    """The result of apply, verify or rollback: a value, not a log line."""

    action: str  # "apply", "verify", "rollback", "recover"
    profile: str | None
    ok: bool
    results: tuple[SettingResult, ...] = ()
    seconds: float = 0.0
    error: str = ""
    previous: str | None = None

    def failed(self) -> list[SettingResult]:
        return [r for r in self.results if r.outcome is Outcome.FAILED]

    def to_json(self) -> dict:
        return {
            "action": self.action,
            "profile": self.profile,
            "previous": self.previous,
            "ok": self.ok,
            "seconds": round(self.seconds, 6),
            "error": self.error,
            "results": [r.to_json() for r in self.results],
        }


@dataclass(frozen=True)
class Profile:
    """A loaded profile: its name, the files it came from (child last), its settings in order."""

    name: str
    files: tuple[str, ...]
    sections: dict[str, dict] = field(default_factory=dict)  # merged raw sections
    origins: dict[tuple[str, str], str] = field(default_factory=dict)  # (section, key) -> file
    description: str = ""
    digest: str = ""  # content hash, for a profile sent as content (ProfileSpec) rather than a file
