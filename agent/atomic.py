"""Crash-safe small files: write to a temporary sibling, fsync, rename, fsync the directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    """Readable by the agent's user only by default: the agent's files hold its credential and
    its tasks' secret environment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # an older temporary file of the same name keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_json(path: Path) -> Any | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    dfd = os.open(path.parent, os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
