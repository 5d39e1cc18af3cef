"""Every name the code uses is defined (pyflakes' undefined names), in the product, the benches, the
scripts and the tests: a name lost in a refactoring fails here, not first in the rare branch that
reads it (the leader election's create() lost `decode` when the codec moved to a module of its own,
and raised NameError whenever another member held the key)."""

from __future__ import annotations

from pathlib import Path

from pyflakes import api, messages
from pyflakes.reporter import Reporter

REPO = Path(__file__).resolve().parents[1]
TREES = ("agent", "controlplane", "bench", "scripts", "tests")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class Collect(Reporter):
    def __init__(self) -> None:
        self.found: list[str] = []

    def unexpectedError(self, filename, msg) -> None:
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:
        self.found.append(f"{filename}:{lineno}: {msg}")

    def flake(self, message) -> None:
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))


def undefined(paths: list[Path]) -> list[str]:
    out = Collect()
    for path in paths:
        api.checkPath(str(path), out)
    return out.found


def test_the_check_finds_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from json import loads\n\ndef f(raw):\n    return decode(raw), loads(raw)\n")
    (found,) = undefined([bad])
    assert "undefined name 'decode'" in found


def test_no_undefined_names():
    paths = sorted(p for tree in TREES for p in (REPO / tree).rglob("*.py"))
    assert len(paths) > 200
    assert undefined(paths) == []
