"""`twine-agent profile show|diff|apply|verify|rollback|current`: readable tables or --json."""

from __future__ import annotations

import json

from agent.console import EXIT_FAILED, EXIT_OK, dump
from agent.config import AgentConfig
from agent.profiles.engine import Engine
from agent.profiles.model import Outcome, Report


def _short(value: object, width: int = 28) -> str:
    text = "-" if value is None else (value if isinstance(value, str) else json.dumps(value, sort_keys=True))
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def print_report(report: Report) -> None:
    head = f"{report.action} {report.profile or '(none)'}: {'ok' if report.ok else 'FAILED'} in {report.seconds * 1000:.1f} ms"
    if report.previous:
        head += f" (previous profile: {report.previous})"
    print(head)
    if report.results:
        rows = [("SETTING", "OUTCOME", "BEFORE", "AFTER", "TIME", "REASON")]
        for r in report.results:
            rows.append((
                _short(r.setting_id, 48), r.outcome.value, _short(r.before), _short(r.after if r.outcome is not Outcome.NOT_APPLICABLE else None),
                f"{r.seconds * 1000:.2f} ms", r.reason,
            ))
        print(_table(rows))
    if report.error:
        print(f"error: {report.error}")


def profile_command(args, config: AgentConfig) -> int:
    engine = Engine(config.host_context(), config.state_dir, config.profile_search())
    action = args.action
    if action == "show":
        profile, settings = engine.load(args.profile)
        if args.json:
            dump({
                "name": profile.name, "description": profile.description, "files": list(profile.files),
                "settings": [{"setting": s.id, "value": s.value, "origin": s.origin} for s in settings],
            })
            return EXIT_OK
        print(f"profile {profile.name}: {profile.description}")
        print("files: " + " <- ".join(profile.files))
        print(_table([("SETTING", "VALUE", "FROM")] + [(_short(s.id, 48), _short(s.value, 40), s.origin) for s in settings]))
        return EXIT_OK
    if action == "diff":
        profile, plan = engine.plan(args.profile)
        if args.json:
            dump({"profile": profile.name, "changes": [p.to_json() for p in plan]})
            return EXIT_OK
        changes = sum(p.action in ("change", "restore") for p in plan)
        print(f"diff {profile.name}: {changes} setting(s) would change")
        rows = [("SETTING", "ACTION", "CURRENT", "DESIRED", "REASON")]
        rows += [(_short(p.setting.id, 48), p.action, _short(p.current), _short(p.setting.value), p.reason) for p in plan]
        print(_table(rows))
        return EXIT_OK
    if action == "current":
        record = engine.current()
        if args.json:
            dump(record)
        elif record is None:
            print("no profile is applied")
        else:
            print(f"{record['profile']} (applied in {record['switch_seconds'] * 1000:.1f} ms; files: {', '.join(record['files'])})")
        return EXIT_OK
    report = {"apply": lambda: engine.apply(args.profile), "verify": lambda: engine.verify(args.profile),
              "rollback": engine.rollback}[action]()
    if args.json:
        dump(report.to_json())
    else:
        print_report(report)
    return EXIT_OK if report.ok else EXIT_FAILED
