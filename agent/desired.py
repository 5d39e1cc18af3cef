"""Where the desired state comes from. A source pushes each new DesiredState to a callback.

`FileSource` watches a local file; the control plane will plug in as another source. The agent
keeps the last accepted desired state on local disk, so that it survives a restart while the
source is unreachable (tasks keep running).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable, Protocol

from agent import atomic
from agent.errors import InputError
from agent.models import DesiredState, read_desired_file

log = logging.getLogger("twine.agent.desired")
OnChange = Callable[[DesiredState], Awaitable[None]]
OnError = Callable[[str], None]


class DesiredSource(Protocol):
    async def watch(self, on_change: OnChange, on_error: OnError) -> None:
        """Run until cancelled; call on_change for every new desired state, on_error for bad ones."""


class FileSource:
    def __init__(self, path: Path, poll: float = 0.25):
        self.path = Path(path)
        self.poll = poll

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self) -> DesiredState:
        return read_desired_file(self.path)

    async def watch(self, on_change: OnChange, on_error: OnError) -> None:
        # No inotify dependency: a stat every poll interval is cheap and also sees replaced files.
        seen = self._stamp()
        while True:
            await asyncio.sleep(self.poll)
            stamp = self._stamp()
            if stamp == seen:
                continue
            seen = stamp
            if stamp is None:
                on_error(f"{self.path}: file is gone; keeping the last desired state")
                continue
            try:
                desired = self.read()
            except InputError as e:
                log.error("rejected new desired state: %s", e)
                on_error(str(e))
                continue
            await on_change(desired)


def save_cache(state_dir: Path, desired: DesiredState) -> None:
    atomic.write_json(state_dir / "desired.json", {**desired.to_json(), "source": desired.source})


def load_cache(state_dir: Path) -> DesiredState | None:
    data = atomic.read_json(state_dir / "desired.json")
    if data is None:
        return None
    source = data.pop("source", "") or str(state_dir / "desired.json")
    return DesiredState.from_json(data, source, data.get("version", ""))
