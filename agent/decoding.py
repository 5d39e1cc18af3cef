"""Decoding with msgspec into declared types, and its errors made into what a person reads: the
field at fault as a path (`tasks[0].memory_mb`, `task.env.1BAD`) and why, without msgspec's
markup. One decoder for both ends: the control plane's API bodies (frontend/schema.py) and what
the agent reads (its task specs, its config file)."""

from __future__ import annotations

import ast
import re
from typing import Any

import msgspec

_AT = re.compile(r" - at (?:`key` in )?`\$(?P<path>[^`]*)`$")
_FIELD = re.compile(r"(?:unknown|required) field `(?P<name>[^`]+)`")


def error_path(message: str) -> str | None:
    """`Object contains unknown field `x` - at `$.task`` -> task.x; `... - at `$.preferences[0].weight`` ->
    preferences[0].weight."""
    m = _AT.search(message)
    path = m.group("path").lstrip(".").removesuffix("[...]") if m else ""
    if f := _FIELD.search(message):
        path = f"{path}.{f.group('name')}" if path else f.group("name")
    return path or None


def error_why(message: str) -> str:
    return _AT.sub("", message).replace("`", "'")


def bad_key(data: Any, path: str | None, message: str) -> str | None:
    """The key a pattern refused (msgspec names the object, not the key): `task.env.1BAD`."""
    obj = value_at(data, path)
    pattern = re.search(r"matching regex ('.*') - at ", message)
    if not isinstance(obj, dict) or pattern is None:
        return None
    regex = ast.literal_eval(pattern.group(1))  # msgspec shows the pattern as Python's repr of it
    bad = next((k for k in obj if not re.search(regex, k)), None)
    return None if bad is None else f"{path}.{bad}"


def value_at(data: Any, path: str | None) -> Any:
    """What `data` holds at `path` (dots and [i]), or None when it holds nothing there."""
    obj = data
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path or ""):
        if part.startswith("[") and isinstance(obj, list):
            i = int(part[1:-1])
            obj = obj[i] if i < len(obj) else None
        elif isinstance(obj, dict):
            obj = obj.get(part)
        else:
            return None
    return obj


def field_and_why(data: Any, e: msgspec.ValidationError) -> tuple[str | None, str]:
    """The field a ValidationError is about (the key itself when a key was refused) and why."""
    message = str(e)
    field = error_path(message)
    if " - at `key` in " in message:
        field = bad_key(data, field, message) or field
    return field, error_why(message)
