"""bench/bench_commit.py --memory at a small size (issue #38): it commits real jobs through the
daemon's path and says what each task left in memory, beside the allocator's snapshot alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"\s+10,000 machines: \(2\) the daemon's commit path (?P<two>[\d,]+) bytes a task; "
                  r"\(1\) the snapshot alone (?P<one>[\d,]+) \(ratio \d+\.\d\)")


def test_memory_says_what_a_committed_task_leaves_beside_the_snapshot_alone():
    out = subprocess.run([sys.executable, str(REPO / "bench/bench_commit.py"), "--memory", "--sizes", "10000",
                          "--jobs", "100"], capture_output=True, text=True, timeout=300, check=True).stdout
    (m,) = [LINE.fullmatch(line) for line in out.splitlines() if LINE.fullmatch(line)]
    two, one = int(m["two"].replace(",", "")), int(m["one"].replace(",", ""))
    # a task's record and its place in the view and the snapshot: more than the snapshot's part alone,
    # and far from the 1.6 KB it took before the view shared its strings and dropped discovery records
    assert 0 < one < two < 1200, out
