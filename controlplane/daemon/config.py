"""twine-controld's config file (`--config`, default /etc/twine/controld.toml): its flags as TOML.

    etcd = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]   # or one string, "h1:2379,h2:2379"
    listen = "0.0.0.0:7080"
    api_token_file = "/etc/twine/api-tokens"
    bootstrap_token_file = "/etc/twine/bootstrap-tokens"
    heartbeat_timeout = 5.0
    profiles = ["/etc/twine/profiles"]

A key is a flag's name without the dashes (`-` or `_`); a flag on the command line overrides the
file. Unknown keys and values of the wrong type are refused with the key's name (exit 2).

`etcd` lists the members of one etcd cluster. The daemon talks to one at a time and moves to the
next when a call cannot reach it. While no member answers, the daemon stays up: reads answer from
its cache with `X-Twine-Stale: <why>`, writes and `/healthz` answer 503 naming the cause, the
agents keep their tasks, and when etcd is back the daemon reads the region afresh by itself
(docs/api.md, "When etcd is unreachable").
"""

from __future__ import annotations

import argparse
import tomllib


DEFAULT = "/etc/twine/controld.toml"
COMMA_LISTS = {"etcd"}  # a comma-separated flag: the file may give a TOML list instead
NUMBERS = {"bootstrap_token_ttl"}  # flags of a type of their own that a number in the file may set


class ConfigError(Exception):
    pass


def file_defaults(parser: argparse.ArgumentParser, path: str) -> dict:
    """The file's settings as argparse defaults. A missing default file is no settings."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        if path == DEFAULT:
            return {}
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    out: dict = {}
    for key, value in data.items():
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is None:
            raise ConfigError(f"{path}: {key}: unknown setting; known: {', '.join(sorted(actions))}")
        out[dest] = _typed(path, key, value, action)
    return out


def _typed(path: str, key: str, value: object, action: argparse.Action) -> object:
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{path}: {key}: must be a string or a list of strings")
        return items
    if action.type is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{path}: {key}: must be a positive integer, not {value!r}")
        return value
    if action.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{path}: {key}: must be a positive number, not {value!r}")
        return float(value)
    if action.dest in NUMBERS and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:  # a number with a check of its own: checked as the flag's value is
            return action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise ConfigError(f"{path}: {key}: {e}") from None
    if action.dest in COMMA_LISTS and isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if not isinstance(value, str):
        kind = "a string or a list of strings" if action.dest in COMMA_LISTS else "a string"
        raise ConfigError(f"{path}: {key}: must be {kind}, not {value!r}")
    if action.choices and value not in action.choices:
        raise ConfigError(f"{path}: {key}: must be one of {', '.join(action.choices)}, not {value!r}")
    return value


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Flags over the config file over the built-in defaults."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=DEFAULT)
    known, _ = pre.parse_known_args(argv)
    try:
        parser.set_defaults(**file_defaults(parser, known.config))
    except ConfigError as e:
        parser.exit(2, f"twine-controld: --config: {e}\n")
    args = parser.parse_args(argv)
    if not args.api_token_file:  # bootstrap tokens may all be made by an admin (twinectl token create)
        parser.exit(2, f"twine-controld: --api-token-file: required (a flag, or api_token_file in {args.config})\n")
    return args



