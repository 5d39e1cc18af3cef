"""bench/bench_region_scale.py at a small size (issue #38): it runs its phases on real etcd and
real twine-controld processes, and its last line is the issue's, word for word (the size named as
it is: `region 3k`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAST = re.compile(r"region (?P<size>\S+): rss \d+\.\d\d GiB; heartbeats (?P<beats>\d+)/s; one shard (?P<jobs>\d+\.\d) jobs/s; "
                  r"fleet \d+ ms; scrape stall \d+ ms; false verdicts (?P<false>\d+)")


def test_a_small_region_runs_every_phase_and_ends_with_the_issues_line():
    out = subprocess.run([sys.executable, str(REPO / "bench/bench_region_scale.py"), "--machines", "3000", "--agents",
                          "1000", "--processes", "2", "--shards", "4", "--seconds", "4"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    lines = out.strip().splitlines()
    m = LAST.fullmatch(lines[-1])
    assert m, lines[-1]
    assert m["size"] == "3k" and m["false"] == "0" and float(m["jobs"]) > 0 and int(m["beats"]) > 50, lines[-1]
    assert any(line.startswith("6. GET /v1/fleet") for line in lines) and any(line.startswith("7. Prometheus")
                                                                                for line in lines)


def test_the_heartbeat_figure_counts_those_due_in_the_window_answered_in_time():
    """H: heartbeats due in the window and answered 200 within the interval, per second of it; one
    due at the window's end counts though its answer comes after it, a late one does not."""
    from array import array
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO / "bench"))
    from bench_region_scale import in_time

    due = [i / 10 for i in range(100)]  # 10 a second for 10 s
    wait = [0.05] * 100
    wait[50] = 11.0  # answered, but after the agent's next was due
    pipes = [SimpleNamespace(ok_sent=array("d", due[0::2]), ok_wait=array("d", wait[0::2])),
             SimpleNamespace(ok_sent=array("d", due[1::2]), ok_wait=array("d", wait[1::2]))]
    assert in_time(pipes, 0.0, 10.0, 10.0) == 9.9
    assert in_time(pipes, 0.0, 5.0, 10.0) == 10.0  # 9.99's answer arrives after 5.0: counted
    del pipes[1].ok_sent[10], pipes[1].ok_wait[10]  # one due at 2.1 not answered
    assert in_time(pipes, 0.0, 5.0, 10.0) == 49 / 5
