"""twine-agent: `run` the node agent, or manage host profiles by hand with `profile ...`.

Exit codes (scripts rely on them):
  0  done; every setting holds (settings not applicable on this host are reported, not errors)
  1  a setting failed: an apply was rolled back, or verify found settings that do not hold
  2  bad input: a malformed or invalid profile, desired-state or config file; nothing was changed
  3  the agent or the host is not reachable / not ready (status, docker)
"""

from __future__ import annotations

import argparse
import sys

from agent.console import EXIT_INPUT
from agent.errors import InputError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twine-agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="/etc/twine/agent.toml", help="agent config file (default: %(default)s)")
    p.add_argument("--state-dir", help="state directory (default from config: /var/lib/twine-agent)")
    sub = p.add_subparsers(dest="command", required=True)

    prof = sub.add_parser("profile", help="show, diff, apply, verify or roll back a host profile")
    prof_sub = prof.add_subparsers(dest="action", required=True)
    for action, help_ in [
        ("show", "print a profile as merged from its includes, with its settings"),
        ("diff", "what apply would change (dry run)"),
        ("apply", "switch the host to the profile (rolled back whole if any setting fails)"),
        ("verify", "check that the host holds the profile (default: the applied one)"),
        ("rollback", "restore every original the applied profile changed"),
        ("current", "print the applied profile"),
    ]:
        sp = prof_sub.add_parser(action, help=help_)
        if action in ("show", "diff", "apply"):
            sp.add_argument("profile", metavar="NAME_OR_FILE")
        elif action == "verify":
            sp.add_argument("profile", metavar="NAME_OR_FILE", nargs="?")
        sp.add_argument("--json", action="store_true", help="machine-readable output")

    run = sub.add_parser("run", help="run the agent daemon")
    from agent.config import add_run_arguments

    add_run_arguments(run)

    st = sub.add_parser("status", help="ask a running agent for its status")
    st.add_argument("--listen", help="the agent's HTTP address (default from config)")
    st.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from agent.config import load_config

        config = load_config(args)
        if args.command == "profile":
            from agent.profiles.cli import profile_command

            return profile_command(args, config)
        if args.command == "run":
            from agent.tls import default_trust

            default_trust(config.control_plane_ca)
            from agent.daemon import run_daemon

            return run_daemon(config)
        if args.command == "status":
            from agent.status_cli import status_command

            return status_command(args, config)
    except InputError as e:
        print(f"twine-agent: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
