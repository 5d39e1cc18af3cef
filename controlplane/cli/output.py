"""How twinectl prints an answer: rendered as text (render.py), or the daemon's JSON (--json)."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from controlplane.cli.api import PROG


class Out:
    """Prints the daemon's JSON indented (--json) or rendered as text."""

    def __init__(self, as_json: bool):
        self.as_json = as_json

    def __call__(self, data: Any, text: Callable[[Any], str]) -> None:
        rendered = None
        if not self.as_json and isinstance(data, dict):
            try:
                rendered = text(data)
            except (AttributeError, KeyError, TypeError, ValueError):  # a shape docs/api.md does not describe
                print(f"{PROG}: cannot show this answer as a table; its JSON follows", file=sys.stderr)
        if rendered is None:
            json.dump(data, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(rendered)
        sys.stdout.flush()

