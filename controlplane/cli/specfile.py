"""Job spec files for `twinectl job run/update`: YAML (.yaml, .yml) or TOML (.toml) on disk, the
JSON body of `POST /v1/jobs` on the wire (docs/api.md).

Checked here, before anything is sent: the file reads and parses (errors name the line), the top
level is a mapping, no top-level key is unknown, no duplicate YAML key, every value is plain JSON
(no YAML/TOML dates). Everything else (types, ranges, placement) is the daemon's to validate.
"""

from __future__ import annotations

import datetime
import difflib
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

SPEC_KEYS = ("entitlement", "name", "count", "task", "requirements", "preferences", "update", "controller",
             "autoscale")
SUFFIXES = {".yaml": "YAML", ".yml": "YAML", ".toml": "TOML"}


class SpecError(Exception):
    """A job spec file that cannot be read, parsed or sent: the CLI prints it and exits 2."""

    def __init__(self, path: str | Path, why: str):
        self.path, self.why = str(path), why
        super().__init__(f"{path}: {why}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last one silently; TOML refuses it, so YAML does too)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: let PyYAML report it
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"duplicate key {key!r} (first at line {first.start_mark.line + 1})", key_node.start_mark)
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_reason(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return problem
    return str(e)


_TOML_AT = re.compile(r"^(?P<why>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.DOTALL)
_TOML_END = re.compile(r"^(?P<why>.*?)\s*\(at end of document\)$", re.DOTALL)


def _toml_reason(e: tomllib.TOMLDecodeError) -> str:
    msg = str(e)
    m = _TOML_AT.match(msg)
    if m:
        return f"line {m['line']}, column {m['col']}: {m['why']}"
    m = _TOML_END.match(msg)
    if m:
        return f"at the end of the file: {m['why']}"
    return msg


def parse_spec(text: str, path: str | Path) -> dict:
    """The job spec in `text`, parsed by `path`'s suffix. Raises SpecError."""
    kind = SUFFIXES.get(Path(path).suffix.lower())
    if kind is None:
        raise SpecError(path, "a job spec is a .yaml, .yml or .toml file")
    if kind == "YAML":
        try:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as e:
            raise SpecError(path, f"not valid YAML: {_yaml_reason(e)}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(path, f"not valid TOML: {_toml_reason(e)}") from None
    return check_spec(data, path)


def check_spec(data: Any, path: str | Path) -> dict:
    """The local checks on a parsed spec (see the module docstring). Raises SpecError."""
    if data is None or data == {}:
        raise SpecError(path, f"the file is empty; a job spec is a mapping with {', '.join(SPEC_KEYS[:4])}, ...")
    if not isinstance(data, dict):
        raise SpecError(path, f"the top level must be a mapping of {', '.join(SPEC_KEYS)}, not a {_kind(data)}")
    for key in data:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(str(key), SPEC_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SpecError(path, f"unknown key {key!r}{hint}; a job spec has {', '.join(SPEC_KEYS)}")
    _check_json(data, path, "")
    return data


def read_spec(path: str | Path) -> dict:
    """Read and check the job spec file at `path`. Raises SpecError; nothing is sent then."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise SpecError(path, f"cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(path, f"not UTF-8 text (byte {e.start})") from None
    return parse_spec(text, path)


def spec_handle(spec: dict, path: str | Path) -> str:
    """`<entitlement>/<name>` of a spec, for the URL of `PUT /v1/jobs/{ent}/{name}`."""
    parts = []
    for key in ("entitlement", "name"):
        v = spec.get(key)
        if not isinstance(v, str) or not v or "/" in v:
            raise SpecError(path, f"{key}: must be a name (a non-empty string without '/'), got {v!r}")
        parts.append(v)
    return "/".join(parts)


def _kind(v: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(v), type(v).__name__)


def _check_json(v: Any, path: str | Path, where: str) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise SpecError(path, f"{where or '(top level)'}: key {k!r} must be a string (quote it)")
            _check_json(x, path, f"{where}.{k}" if where else k)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_json(x, path, f"{where}[{i}]")
    elif isinstance(v, (datetime.date, datetime.time)):
        raise SpecError(path, f"{where}: {v} is read as a date/time; quote it to send a string")
    elif isinstance(v, float) and not math.isfinite(v):
        raise SpecError(path, f"{where}: {v} is not a JSON number")
    elif not (v is None or isinstance(v, (str, int, float, bool))):
        raise SpecError(path, f"{where}: a {type(v).__name__} is not a JSON value")
