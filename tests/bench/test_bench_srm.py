"""bench/bench_srm.py's own rules (issue #36): the srm's history is never the minutes measured, the
churn the load asks for is the least that follows it within the tolerance, and the last line is the
issue's, word for word."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_srm  # noqa: E402
from bench_srm import WEEK, need, split  # noqa: E402

LAST = re.compile(r"srm: machine-hours \d+ \(hpa\+ca \d+, static \d+\); over-target minutes \d+ \(hpa\+ca \d+\); "
                  r"churn above need -?\d+ \(hpa\+ca -?\d+\); scale-ins during outages \d+ \(hpa\+ca \d+\)")


def test_the_history_is_never_the_measured_minutes():
    two = [10.0] * WEEK + [20.0] * WEEK
    measured, history, words = split(two, "t.csv")
    assert measured == [20.0] * WEEK and history == [10.0] * WEEK and "first week" in words
    measured, history, words = split([20.0] * WEEK, "t.csv")
    assert measured == [20.0] * WEEK and history is None and "prediction off" in words
    measured, history, _ = split([20.0] * WEEK, "t.csv", [5.0] * WEEK + [7.0] * WEEK, "h.csv")
    assert measured == [20.0] * WEEK and history == [7.0] * WEEK, "a history given: its last week"


def test_need_is_the_least_churn_within_the_tolerance_band():
    per_lo, per_hi = bench_srm.TARGET * 1.1, bench_srm.TARGET * 0.9  # 0.66 and 0.54 a task
    assert need([6.0] * 100, 2) == 0
    # noise within the band moves nothing: 6.0 cores is 9.1-11.1 tasks, 6.3 is 9.5-11.7
    assert need([6.0, 6.3] * 50, 2) == 0
    # a step from 6 to 12 cores: from ceil(6 / 0.66) = 10 to the band's nearest edge, ceil(12 / 0.66) = 19
    assert need([6.0] * 10 + [12.0] * 10, 2) == 19 - 10
    # and back down: from 19 to floor(6 / 0.54) = 11, the band's top
    assert need([6.0] * 10 + [12.0] * 10 + [6.0] * 10, 2) == 9 + (19 - int(6.0 / per_hi))
    assert int(6.0 / per_hi) == 11 and -(-6.0 // per_lo) == 10


def test_the_last_line_is_the_issues(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("".join(f"{m * 60},{20 + (m // 30) % 3 * 5}\n" for m in range(WEEK + 240)))
    out = subprocess.run([sys.executable, str(REPO / "bench/bench_srm.py"), "--trace", str(trace), "--jobs", "2",
                          "--days", "0.15", "--daemon-jobs", "0"], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    lines = out.strip().splitlines()
    assert LAST.fullmatch(lines[-1]), lines[-1]
    assert "its first week the srm's history" in lines[0]
    assert any(line.startswith("hpa+ca ") for line in lines) and any(line.startswith("srm-nopred ") for line in lines)


def test_the_oracle_with_a_scale_in_window_keeps_each_minute_at_the_window_s_largest_size():
    load = [2.4, 4.8, 2.4, 2.4, 2.4]  # 4, 8, 4, 4, 4 tasks at 0.6 a task: 1, 2, 1, 1, 1 machines of 4
    assert bench_srm.oracle([load], 5, bench_srm.TARGET) * 60 == 6
    assert bench_srm.oracle([load], 5, bench_srm.TARGET, window=2) * 60 == 1 + 2 + 2 + 2 + 1
    assert bench_srm.oracle([load], 5, bench_srm.TARGET, window=9) * 60 == 1 + 2 * 4


def test_aim_adds_a_row_of_the_srm_running_hotter_and_refuses_what_is_past_the_over_target_line(tmp_path):
    """--aim 1.08: the srm sizing for target x 1.08 a task holds fewer machines on a steady load than
    at the target; an aim at or past target x 1.1 (over target by definition) is refused."""
    trace = tmp_path / "t.csv"
    trace.write_text("".join(f"{m * 60},40\n" for m in range(WEEK + 240)))
    args = [sys.executable, str(REPO / "bench/bench_srm.py"), "--trace", str(trace), "--jobs", "2", "--days", "0.15",
            "--daemon-jobs", "0"]
    out = subprocess.run(args + ["--aim", "1.08"], capture_output=True, text=True, timeout=300, check=True).stdout
    rows = {m[1]: int(m[2]) for line in out.splitlines() if (m := re.match(r"(srm|srm@1\.08) +(\d+) ", line))}
    assert rows["srm@1.08"] < rows["srm"], out
    bad = subprocess.run(args + ["--aim", "1.1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--aim '1.1': each between 1 and 1.1" in bad.stderr, bad.stderr
