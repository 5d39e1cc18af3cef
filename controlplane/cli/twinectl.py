"""twinectl: the operator's and job owner's command line for twine-controld (docs/api.md).

The usage is parser.py's (and `twinectl --help`'s); the commands are commands.py's, the daemon's
API api.py's. Exit codes (scripts rely on them):
  0  done
  1  the daemon refused or failed (404, 409, 422, 5xx), or --wait ran out of time
  2  bad input: a spec file or argument (nothing was sent), or the daemon's 400
  3  the daemon is unreachable (or did not answer within --timeout)
  4  unauthorized: the daemon's 401/403 (a missing or wrong token)
  141  stdout's reader went away (`twinectl fleet | head`): 128 + SIGPIPE, as a shell reports a
       writer the closed pipe ended; nothing on stderr
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
from pathlib import Path

import yarl

from agent import tls as tls_files
from agent.errors import InputError
from controlplane.cli import values
from controlplane.cli.api import EXIT_INPUT, EXIT_UNAUTHORIZED, PROG, Api, CliError
from controlplane.cli.commands import COMMANDS, Command, job_update
from controlplane.cli.output import Out
from controlplane.cli.parser import DEFAULT_TIMEOUT, DEFAULT_URL, parser
from controlplane.cli.specfile import SpecError, read_spec, spec_handle

EXIT_BROKEN_PIPE = 141


def _settings(args: argparse.Namespace, env: dict) -> tuple[str, str | None, float, bool]:
    """URL, token, timeout and --json from the options, else the environment, else defaults."""
    url = getattr(args, "url", None) or env.get("TWINE_URL") or DEFAULT_URL
    u = yarl.URL(url) if "://" in url else None
    if u is None or u.scheme not in ("http", "https") or not u.host:
        raise CliError(EXIT_INPUT, f"--url: {url!r} is not an http(s) URL like {DEFAULT_URL}")
    token, token_file = getattr(args, "token", None), getattr(args, "token_file", None)
    if token and token_file:
        raise CliError(EXIT_INPUT, "give --token or --token-file, not both")
    if not token and not token_file:  # the options win over the environment
        token = env.get("TWINE_TOKEN") or None
        token_file = None if token else env.get("TWINE_TOKEN_FILE") or None
    if token_file:
        token = read_token_file(token_file)
    timeout = getattr(args, "timeout", None)
    return url, token, DEFAULT_TIMEOUT if timeout is None else timeout, bool(getattr(args, "json", False))


def read_token_file(path: str) -> str:
    """The first non-empty, non-comment line of a token file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(EXIT_INPUT, f"--token-file {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise CliError(EXIT_INPUT, f"--token-file {path}: holds no token")


def _tls(args: argparse.Namespace, env: dict) -> ssl.SSLContext | None:
    """--ca or TWINE_CA: the CA an https daemon's certificate must chain to."""
    ca = getattr(args, "ca", None) or env.get("TWINE_CA") or None
    if ca is None:
        return None
    try:
        return tls_files.client_context(ca, field="--ca")
    except InputError as e:
        raise CliError(EXIT_INPUT, f"--ca {ca}: {e.why}") from None


async def _run(command: Command, args: argparse.Namespace, url: str, token: str | None, timeout: float, out: Out,
               tls: ssl.SSLContext | None = None) -> int:
    async with Api(url, token, timeout, tls) as api:
        return await command(api, args, out)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`twinectl fleet | head`): end quietly, as kubectl does. Stdout now
        # points at /dev/null, so the interpreter's flush at exit finds nothing left to fail on.
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE


def _stdout_to_devnull() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing to flush at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _main(argv: list[str] | None) -> int:
    values.NOW.clear()  # relative times are relative to this command's start
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help: 0; a bad argument: argparse's 2
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    env = os.environ
    command = COMMANDS[(args.group, getattr(args, "action", None))]
    token = None
    try:
        url, token, timeout, as_json = _settings(args, env)
        if getattr(args, "file", None) is not None:  # job run / update: parsed and checked before anything is sent
            args.spec = read_spec(args.file)
            if command is job_update:
                args.handle = spec_handle(args.spec, args.file)
        tls = _tls(args, env)
        return asyncio.run(_run(command, args, url, token, timeout, Out(as_json), tls))
    except SpecError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_INPUT
    except CliError as e:
        msg = e.message
        if e.code == EXIT_UNAUTHORIZED and not token:
            msg += " (no token given: use --token, --token-file, TWINE_TOKEN or TWINE_TOKEN_FILE)"
        print(f"{PROG}: {msg}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
