"""Appliers, found by name: the profile section `[foo]` is handled by the module `foo` here."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from agent.profiles.appliers.base import Applier, HostContext


@cache
def known() -> tuple[str, ...]:
    return tuple(
        sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in ("base",))
    )


def applier_class(name: str) -> type[Applier]:
    """The Applier subclass of the module `name`. KeyError when there is none."""
    if name not in known():
        raise KeyError(name)
    module = importlib.import_module(f"{__name__}.{name}")
    return module.APPLIER


def load(name: str, ctx: HostContext) -> Applier:
    return applier_class(name)(ctx)
