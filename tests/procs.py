"""Freezing a process for a test (SIGSTOP), and knowing it is frozen.

kill(SIGSTOP) returns before the process has stopped: the kernel wakes one of its threads, which
stops the others when it next runs. Until then the others go on; measured here on an idle machine,
1 to 5 ms with etcd's threads still running or sleeping (longer on a loaded one), time enough to
answer a request sent at once (a fresh-clone run met /healthz 200 just after etcd's SIGSTOP).
`freeze` returns when every thread of the process is stopped."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def thread_states(pid: int) -> str:
    """Each thread's state letter (R, S, D, T, ...), as /proc tells it."""
    out = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        out.append(text[text.rindex(")") + 2])
    return "".join(sorted(out))


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP, then wait until every thread of `pid` is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while (states := thread_states(pid)).strip("tT"):  # sorted: the stopped ones (T, t) come last
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped {timeout:g} s after SIGSTOP: threads {states}")
        time.sleep(0.001)
