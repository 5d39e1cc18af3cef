"""How records are written to etcd and read back: compact, sorted JSON by msgspec; a value too
large for any record, or not JSON, read as `Skipped` rather than raised (its owner reports it and
keeps what it had)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

MAX_VALUE = 2 * 1024 * 1024  # bytes: a value larger than any record the API can make (a job: ~130 KiB)


class Skipped:
    """In place of a value too large or not JSON, which a daemon must neither crash on nor let
    block its restart: the owner reports it and keeps what it had (RegionState)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Skipped({self.why})"


def sized(raw: bytes) -> bytes | Skipped:
    """The value as etcd has it, undecoded, unless it is too large for any record."""
    if len(raw) > MAX_VALUE:
        return Skipped(f"{len(raw)} bytes, more than the {MAX_VALUE} a record may have")
    return raw


def decode_value(raw: bytes) -> Any:
    if isinstance(value := sized(raw), Skipped):
        return value
    try:
        return decode(raw)
    except (ValueError, RecursionError) as e:
        return Skipped(f"not JSON: {str(e)[:200]}")


def encode(value: Any) -> bytes:
    """Compact JSON with sorted keys, by msgspec (several times faster than json.dumps on the
    records every commit writes). Same JSON as json.dumps(sort_keys=True, separators=(",", ":"))
    but for spelling: UTF-8 rather than \\u escapes, 1e16 rather than 1e+16; NaN and infinities,
    which JSON has no words for and no record holds, become null. Dicts with keys other than
    strings go through json, which writes the keys as strings (a record first made builtins)."""
    try:
        return msgspec.json.encode(value, order="sorted")
    except TypeError:
        return json.dumps(msgspec.to_builtins(value, str_keys=True), sort_keys=True, separators=(",", ":")).encode()


def decode(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:  # NaN or Infinity, which json.dumps wrote
        return json.loads(raw)
