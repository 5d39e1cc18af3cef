"""The sidekick's profile documents (paper 3.3): a machine's desired state carries its
entitlement's host profile merged from its includes, with a content hash, so profiles are edited
in one place (controld's profile directories) and every host applies the same settings.

Loaded on demand and cached per profile; a cached document is reloaded when any of its files
changes (a stat per file per use), so an edited profile reaches the agents with their next
desired state.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.errors import ProfileError
from agent.models import profile_hash
from agent.profiles import loader

log = logging.getLogger("twine.sidekick")


class ProfileDocuments:
    def __init__(self, search: tuple[Path, ...] | None) -> None:
        self.search = search
        self._cache: dict[str, tuple[tuple, dict]] = {}

    @staticmethod
    def _stamp(files) -> tuple:
        out = []
        for f in files:
            try:
                st = os.stat(f)
                out.append((f, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((f, None, None))
        return tuple(out)

    def document(self, name: str) -> dict | None:
        """{name, hash, sections} of the merged profile, or None when it cannot be loaded here
        (then the agent looks the name up in its own profile directories)."""
        cached = self._cache.get(name)
        if cached is not None and self._stamp(f for f, _, _ in cached[0]) == cached[0]:
            return cached[1]
        try:
            profile = loader.load(loader.ProfileName(name), self.search)
        except ProfileError as e:
            log.warning("profile %s cannot be sent as content: %s", name, e)
            return None
        doc = {"name": profile.name, "hash": profile_hash(profile.sections), "sections": profile.sections}
        self._cache[name] = (self._stamp(profile.files), doc)
        return doc
