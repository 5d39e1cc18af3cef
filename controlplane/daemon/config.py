"""twine-controld's config file (`--config`, default /etc/twine/controld.toml): its flags as TOML.

    etcd = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]   # or one string, "h1:2379,h2:2379"
    listen = "0.0.0.0:7080"
    api_token_file = "/etc/twine/api-tokens"
    bootstrap_token_file = "/etc/twine/bootstrap-tokens"
    heartbeat_timeout = 5.0
    profiles = ["/etc/twine/profiles"]

A key is a flag's name without the dashes (`-` or `_`); a flag on the command line overrides the
file. Unknown keys and values of the wrong type are refused with the key's name (exit 2).

The file is decoded by msgspec into a type made from the flags themselves (`file_type`): each
flag's kind of value gives its key's type and the words an error says of it, so a new flag is a
new key without a line here.

`etcd` lists the members of one etcd cluster. The daemon talks to one at a time and moves to the
next when a call cannot reach it. While no member answers, the daemon stays up: reads answer from
its cache with `X-Twine-Stale: <why>`, writes and `/healthz` answer 503 naming the cause, the
agents keep their tasks, and when etcd is back the daemon reads the region afresh by itself
(docs/api.md, "When etcd is unreachable").
"""

from __future__ import annotations

import argparse
import tomllib
from typing import Annotated, Any, Literal, Union, get_args

import msgspec
from msgspec import Meta

from agent.decoding import error_path

DEFAULT = "/etc/twine/controld.toml"
COMMA_LISTS = {"etcd"}  # a comma-separated flag: the file may give a TOML list instead
NUMBERS = {"bootstrap_token_ttl"}  # flags of a type of their own that a number in the file may set

# the kinds of value a key may hold, each with the words an error says of it
Text = Annotated[str, Meta(description="a string")]
Texts = Annotated[Union[str, list[str]], Meta(description="a string or a list of strings")]
PositiveInt = Annotated[int, Meta(ge=1, description="a positive integer")]
PositiveNumber = Annotated[float, Meta(gt=0, description="a positive number")]
Number = Annotated[Union[float, str], Meta(description="a number")]


class ConfigError(Exception):
    pass


def _kind(action: argparse.Action) -> Any:
    """The type of a key from its flag: what the flag takes, as TOML may give it."""
    if isinstance(action, argparse._AppendAction) or action.dest in COMMA_LISTS:
        return Texts
    if action.type is int:
        return PositiveInt
    if action.type is float:
        return PositiveNumber
    if action.dest in NUMBERS:
        return Number
    if action.choices:
        return Annotated[Literal[tuple(action.choices)],  # type: ignore[valid-type]
                         Meta(description=f"one of {', '.join(action.choices)}")]
    return Text


def _kinds(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {a.dest: _kind(a) for a in parser._actions if a.dest not in ("help", "config")}


def file_type(parser: argparse.ArgumentParser) -> type:
    """The config file's type: a key per flag, typed by what the flag takes."""
    return msgspec.defstruct("ControldConfig", [(k, kind, msgspec.UNSET) for k, kind in _kinds(parser).items()],
                             forbid_unknown_fields=True)


def _words(kind: Any) -> str:
    """What a key's type says it holds (its declaration's description)."""
    return next(m.description for m in get_args(kind)[1:] if isinstance(m, Meta))


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
    data = {key.replace("-", "_"): value for key, value in data.items()}
    struct = file_type(parser)
    try:
        settings = msgspec.convert(data, struct, strict=True)
    except msgspec.ValidationError as e:
        key = (error_path(str(e)) or "").partition("[")[0]
        if "unknown field" in str(e):
            known = ", ".join(sorted(struct.__struct_fields__))
            raise ConfigError(f"{path}: {key}: unknown setting; known: {known}") from None
        raise ConfigError(f"{path}: {key}: must be {_words(_kinds(parser)[key])}, not {data.get(key)!r}") from None
    actions = {a.dest: a for a in parser._actions}
    out: dict = {}
    for key in struct.__struct_fields__:
        value = getattr(settings, key)
        if value is msgspec.UNSET:
            continue
        if key in COMMA_LISTS and isinstance(value, list):
            value = ",".join(value)
        elif isinstance(actions[key], argparse._AppendAction) and isinstance(value, str):
            value = [value]
        elif key in NUMBERS and not isinstance(value, str):
            try:  # a number with a check of its own: checked as the flag's value is
                value = actions[key].type(str(value))
            except (argparse.ArgumentTypeError, ValueError) as e:
                raise ConfigError(f"{path}: {key}: {e}") from None
        out[key] = value
    return out


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
