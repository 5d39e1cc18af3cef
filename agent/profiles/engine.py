"""Switching a host from one profile to another, as one journaled transaction.

read current values -> save originals to the journal -> restore what the old profile set and the
new one does not -> write the new settings in applier order, verifying each -> on any failure roll
every touched setting back to what it was before the switch. A journal found at start means a
switch died half-way: it is rolled back (`recover`).

Two files in the state dir: `profile-applied.json` (the applied profile, its settings, and the
originals from before any profile touched them) and `profile-journal.json` (only during a switch).
"""

from __future__ import annotations

import fcntl
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from agent import atomic
from agent.profiles import appliers, loader
from agent.profiles.appliers.base import KERNEL, Applier, ApplierError, HostContext
from agent.profiles.model import (
    Differs,
    Holds,
    NotApplicable,
    Outcome,
    PlannedSetting,
    Profile,
    Report,
    Setting,
    SettingResult,
    Verdict,
)

APPLIED = "profile-applied.json"
JOURNAL = "profile-journal.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot of the kernel: a new value after every reboot."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class _Undo:
    applier: str
    key: str
    value: object

    def to_json(self) -> dict:
        return {"applier": self.applier, "key": self.key, "value": self.value}

    @classmethod
    def from_json(cls, d: dict) -> "_Undo":
        return cls(d["applier"], d["key"], d["value"])


class Engine:
    def __init__(self, ctx: HostContext, state_dir: Path, search: tuple[Path, ...] | None = None):
        self.ctx = ctx
        self.state_dir = Path(state_dir)
        self.search = tuple(Path(p) for p in search) if search is not None else None
        self._appliers: dict[str, Applier] = {}

    # -- helpers -----------------------------------------------------------------------------

    def applier(self, name: str) -> Applier:
        if name not in self._appliers:
            self._appliers[name] = appliers.load(name, self.ctx)
        return self._appliers[name]

    def _not_applicable(self, applier: Applier, key: str) -> NotApplicable | None:
        if not self.ctx.owns_kernel and applier.scope(key) == KERNEL:
            return NotApplicable("shared kernel: another agent on this host owns kernel-wide settings")
        return applier.applicable(key)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "profile.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def forget_previous_boot(self) -> str | None:
        """After a reboot the kernel is back at its boot values: the applied record and any journal
        describe a kernel that is gone. Drop both, so the next apply takes today's boot values as
        its originals (and a half-done switch is not "undone" onto a fresh kernel). Returns the
        profile that was applied before the reboot, to apply again; None when nothing was dropped."""
        with self._locked():
            record = self.current()
            journal = atomic.read_json(self.state_dir / JOURNAL)
            now = boot_id()
            stale = [d for d in (record, journal) if d is not None and d.get("boot_id") not in (None, now)]
            if not stale:
                return None
            atomic.remove(self.state_dir / JOURNAL)
            atomic.remove(self.state_dir / APPLIED)
            return (record.get("ref") or record["profile"]) if record in stale else None

    def current(self) -> dict | None:
        """The applied-profile record, or None when no profile is applied."""
        return atomic.read_json(self.state_dir / APPLIED)

    def in_force(self, name: str | None, digest: str | None = None) -> bool:
        """Is this profile (by name or file as asked for, and content hash when given) what the host
        holds? None asks for no profile at all. After a rollback that could not restore everything
        the record keeps the originals still to restore, but no profile is in force: applying any
        profile, the same one included, must write its settings again."""
        record = self.current()
        if name is None:
            return record is None
        if record is None or record.get("rollback_incomplete") or name not in (record.get("ref"), record["profile"]):
            return False
        return digest is None or record.get("hash") == digest

    def load(self, name_or_file: str | Profile) -> tuple[Profile, list[Setting]]:
        """Load and fully validate a profile for this host (a name, a file, or a Profile sent as
        content). Raises ProfileError; touches nothing."""
        profile = name_or_file if isinstance(name_or_file, Profile) else loader.load(name_or_file, self.search)
        settings = loader.settings(profile, self.ctx)
        by_applier: dict[str, list[Setting]] = {}
        for s in settings:
            by_applier.setdefault(s.applier, []).append(s)
        for name, group in by_applier.items():
            applier = self.applier(name)
            applier.check([s for s in group if self._not_applicable(applier, s.key) is None])
        return profile, settings

    def _stale(self, record: dict | None, keep: set[str]) -> list[_Undo]:
        """Originals of the old profile's settings that the new one does not set, to restore."""
        if not record:
            return []
        stale = [_Undo.from_json(o) for sid, o in record["originals"].items() if sid not in keep]
        return sorted(stale, key=lambda u: -appliers.applier_class(u.applier).order)

    # -- diff --------------------------------------------------------------------------------

    def plan(self, name_or_file: str) -> tuple[Profile, list[PlannedSetting]]:
        profile, settings = self.load(name_or_file)
        record = self.current()
        out = []
        for u in self._stale(record, {s.id for s in settings}):
            current = self.applier(u.applier).read(u.key)
            s = Setting(u.applier, u.key, u.value, "original")
            action = "hold" if current == u.value else "restore"
            out.append(PlannedSetting(s, current, action, "set by the previous profile only"))
        for s in settings:
            a = self.applier(s.applier)
            na = self._not_applicable(a, s.key)
            if na:
                out.append(PlannedSetting(s, None, "not applicable", na.why))
                continue
            verdict = a.verify(s.key, s.value)
            current = a.read(s.key)
            out.append(PlannedSetting(s, current, "hold" if isinstance(verdict, Holds) else "change"))
        return profile, out

    # -- apply -------------------------------------------------------------------------------

    def apply(self, name_or_file: str | Profile) -> Report:
        t0 = time.perf_counter()
        with self._locked():
            self._recover_locked()
            profile, settings = self.load(name_or_file)
            record = self.current()
            previous = record["profile"] if record else None
            old_originals = record["originals"] if record else {}

            results: list[SettingResult] = []
            originals: dict[str, dict] = {}
            not_applicable: dict[str, str] = {}
            to_write: list[tuple[Setting, object]] = []  # (setting, value before the switch)
            for s in settings:
                a = self.applier(s.applier)
                na = self._not_applicable(a, s.key)
                if na:
                    not_applicable[s.id] = na.why
                    results.append(SettingResult(s.id, Outcome.NOT_APPLICABLE, s.value, reason=na.why))
                    continue
                st = time.perf_counter()
                before = a.read(s.key)
                originals[s.id] = old_originals.get(s.id) or _Undo(s.applier, s.key, before).to_json()
                if isinstance(a.verify(s.key, s.value), Holds):
                    results.append(
                        SettingResult(s.id, Outcome.HELD, s.value, before, before, seconds=time.perf_counter() - st)
                    )
                else:
                    to_write.append((s, before))
            stale = self._stale(record, set(originals))

            journal = [
                *(_Undo(u.applier, u.key, self.applier(u.applier).read(u.key)) for u in stale),
                *(_Undo(s.applier, s.key, before) for s, before in to_write),
            ]
            atomic.write_json(
                self.state_dir / JOURNAL,
                {"target": profile.name, "previous": previous, "boot_id": boot_id(), "undo": [u.to_json() for u in journal]},
            )

            done: list[_Undo] = []
            failure: SettingResult | None = None
            steps = [(Setting(u.applier, u.key, u.value, "original"), Outcome.RESTORED) for u in stale]
            steps += [(s, Outcome.APPLIED) for s, _ in to_write]
            for (s, outcome), undo in zip(steps, journal, strict=True):
                result = self._write_verified(s, undo.value, outcome)
                done.append(undo)
                if result.outcome is Outcome.FAILED:
                    failure = result
                    break
                results.append(result)

            if failure is not None:
                rollback_errors = self._undo(done)
                rolled = {u.applier + ":" + u.key for u in done[:-1]}
                results = [
                    SettingResult(r.setting_id, Outcome.ROLLED_BACK, r.desired, r.before, r.before, r.reason, r.seconds)
                    if r.setting_id in rolled and r.outcome in (Outcome.APPLIED, Outcome.RESTORED)
                    else r
                    for r in results
                ]
                results.append(failure)
                if not rollback_errors:
                    atomic.remove(self.state_dir / JOURNAL)
                error = f"{failure.setting_id}: {failure.reason}; rolled back to {previous or 'the host as it was'}"
                if rollback_errors:
                    error += "; rollback incomplete: " + "; ".join(rollback_errors)
                return Report("apply", profile.name, False, tuple(results), time.perf_counter() - t0, error, previous)

            seconds = time.perf_counter() - t0
            atomic.write_json(
                self.state_dir / APPLIED,
                {
                    "profile": profile.name,
                    # as asked for: a name or a file path; a profile sent as content by its name and hash
                    "ref": profile.name if isinstance(name_or_file, Profile) else name_or_file,
                    "hash": profile.digest,
                    "files": list(profile.files),
                    "applied_at": time.time(),
                    "boot_id": boot_id(),
                    "switch_seconds": seconds,
                    "settings": {s.id: _Undo(s.applier, s.key, s.value).to_json() for s in settings},
                    "originals": originals,
                    "not_applicable": not_applicable,
                },
            )
            atomic.remove(self.state_dir / JOURNAL)
            return Report("apply", profile.name, True, tuple(results), seconds, previous=previous)

    def _write_verified(self, s: Setting, before: object, outcome: Outcome) -> SettingResult:
        a = self.applier(s.applier)
        st = time.perf_counter()
        try:
            a.write(s.key, s.value)
            verdict: Verdict = a.verify(s.key, s.value)
        except (OSError, ApplierError) as e:  # the kernel said no: a value, not a crash
            verdict = Differs(None, str(e))
        took = time.perf_counter() - st
        if isinstance(verdict, Holds):
            return SettingResult(s.id, outcome, s.value, before, s.value, seconds=took)
        if isinstance(verdict, NotApplicable):
            return SettingResult(s.id, Outcome.NOT_APPLICABLE, s.value, before, reason=verdict.why, seconds=took)
        return SettingResult(s.id, Outcome.FAILED, s.value, before, verdict.actual, verdict.why, took)

    def _undo(self, done: list[_Undo]) -> list[str]:
        errors = []
        for u in reversed(done):
            try:
                self.applier(u.applier).write(u.key, u.value)
            except (OSError, ApplierError) as e:
                errors.append(f"{u.applier}:{u.key}: {e}")
        return errors

    def hold(self, applier_name: str) -> list[str]:
        """Write again the applied profile's settings of one applier that no longer hold, when
        something the agent itself runs undoes them (runc turns the cgroup cpu controller on for
        every container it creates). The originals stay as they were. Returns the ids written."""
        with self._locked():
            record = self.current()
            if record is None or record.get("rollback_incomplete"):
                return []
            applier, written = self.applier(applier_name), []
            for sid, d in record["settings"].items():
                if d["applier"] != applier_name or sid in record.get("not_applicable", {}):
                    continue
                if not isinstance(applier.verify(d["key"], d["value"]), Holds):
                    applier.write(d["key"], d["value"])
                    written.append(sid)
            return written

    # -- recover, rollback, verify ---------------------------------------------------------------

    def recover(self) -> Report | None:
        """Roll back a switch that died half-way (the journal is still there). None if none."""
        with self._locked():
            return self._recover_locked()

    def _recover_locked(self) -> Report | None:
        journal = atomic.read_json(self.state_dir / JOURNAL)
        if journal is None:
            return None
        t0 = time.perf_counter()
        undo = [_Undo.from_json(u) for u in journal["undo"]]
        errors = self._undo(undo)
        if not errors:
            atomic.remove(self.state_dir / JOURNAL)
        results = tuple(SettingResult(f"{u.applier}:{u.key}", Outcome.ROLLED_BACK, after=u.value) for u in undo)
        return Report(
            "recover", journal["target"], not errors, results, time.perf_counter() - t0, "; ".join(errors),
            journal["previous"],
        )

    def rollback(self) -> Report:
        """Put back every original the applied profile changed; afterwards no profile is applied."""
        t0 = time.perf_counter()
        with self._locked():
            self._recover_locked()
            record = self.current()
            if record is None:
                return Report("rollback", None, True, (), time.perf_counter() - t0, "no profile is applied")
            stale = self._stale(record, set())
            journal = [_Undo(u.applier, u.key, self.applier(u.applier).read(u.key)) for u in stale]
            atomic.write_json(
                self.state_dir / JOURNAL,
                {"target": None, "previous": record["profile"], "boot_id": boot_id(), "undo": [u.to_json() for u in journal]},
            )
            results = []
            for u, cur in zip(stale, journal, strict=True):
                s = Setting(u.applier, u.key, u.value, "original")
                results.append(self._write_verified(s, cur.value, Outcome.RESTORED))
            failed = [r for r in results if r.outcome is Outcome.FAILED]
            if failed:
                # Keep the record of what could not be restored; drop the journal so that this
                # partial restore is not itself undone.
                record["originals"] = {k: v for k, v in record["originals"].items() if k in {r.setting_id for r in failed}}
                record["rollback_incomplete"] = "; ".join(f"{r.setting_id}: {r.reason}" for r in failed)
                atomic.write_json(self.state_dir / APPLIED, record)
            else:
                atomic.remove(self.state_dir / APPLIED)
            atomic.remove(self.state_dir / JOURNAL)
            error = record.get("rollback_incomplete", "") if failed else ""
            return Report("rollback", record["profile"], not failed, tuple(results), time.perf_counter() - t0, error)

    def verify(self, name_or_file: str | None = None) -> Report:
        """Does the host hold the profile's settings? Default: the applied profile."""
        t0 = time.perf_counter()
        if name_or_file is None:
            record = self.current()
            if record is None:
                return Report("verify", None, True, (), 0.0, "no profile is applied")
            name = record["profile"]
            settings = [Setting(d["applier"], d["key"], d["value"]) for d in record["settings"].values()]
        else:
            profile, settings = self.load(name_or_file)
            name = profile.name
        results = []
        for s in settings:
            a = self.applier(s.applier)
            st = time.perf_counter()
            verdict = self._not_applicable(a, s.key) or a.verify(s.key, s.value)
            took = time.perf_counter() - st
            if isinstance(verdict, Holds):
                results.append(SettingResult(s.id, Outcome.HOLDS, s.value, after=s.value, seconds=took))
            elif isinstance(verdict, NotApplicable):
                results.append(SettingResult(s.id, Outcome.NOT_APPLICABLE, s.value, reason=verdict.why, seconds=took))
            else:
                results.append(SettingResult(s.id, Outcome.FAILED, s.value, after=verdict.actual, reason=verdict.why, seconds=took))
        ok = not any(r.outcome is Outcome.FAILED for r in results)
        return Report("verify", name, ok, tuple(results), time.perf_counter() - t0)
