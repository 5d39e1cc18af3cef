"""bench_rebalancer.py's baselines on a board of a few machines: the autoscaler's rule per MSB and
entitlement-wide, and HighNodeUtilization's placement as MostAllocated's, each judged by the plan
checker like ours (issue #36); and the bench's last line, of our round within the autoscaler's
moves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from bench_rebalancer import ca_scale_down, high_node, least_cooling, least_moves  # noqa: E402
from controlplane.rebalancer.board import Board  # noqa: E402
from controlplane.rebalancer.goals import msb_hotspots  # noqa: E402
from controlplane.rebalancer.view import Group, Machine, Region, Task  # noqa: E402


def region() -> Region:
    """web in dc1: msb1 holds a (1 of 16 cores requested) and b (12 of 16); msb2 holds c (2 of 16)
    and d (10 of 16). api spreads over both MSBs, one task in each."""
    ms = {n: Machine(n, "web", "dc1", msb, 16_000, 65_536, rack=f"r{n}") for n, msb in
          (("a", "msb1"), ("b", "msb1"), ("c", "msb2"), ("d", "msb2"))}
    tasks = {"msb1": [Task("web/api", 0, "a", 1000, 1024), Task("web/big", 0, "b", 12_000, 8192)],
             "msb2": [Task("web/api", 1, "c", 2000, 1024), Task("web/big", 1, "d", 10_000, 8192)]}
    groups = [Group("web", "dc1", msb, [m for m in ms.values() if m.msb == msb], tasks[msb]) for msb in ("msb1", "msb2")]
    return Region(groups, {("dc1", "msb1"): 32_000, ("dc1", "msb2"): 32_000})


def test_ca_scale_down_drains_within_the_msb_and_entitlement_wide_across_msbs():
    # the same per-job budget as ours (a quarter of api's 2 tasks: 1 move): a is drained, not c
    assert (ca_scale_down(region(), same_msb=True).freed, ca_scale_down(region(), same_msb=True).moves) == (1, 1)
    per_msb = ca_scale_down(region(), same_msb=True, churn=1.0)
    # a (6 % requested) fits on b; c (12 %) fits on d: both drained, each within its MSB
    assert (per_msb.freed, per_msb.moves, per_msb.violations) == (2, 2, []), per_msb
    assert per_msb.after.spread_excess == per_msb.before.spread_excess == 0
    wide = ca_scale_down(region(), same_msb=False, churn=1.0)
    # a first (least requested), best fit over the dc: b (4 cores free, the fullest that holds it);
    # then c's 2 cores: b again (3 free), in msb1: api's two tasks share an MSB, which the checker reports
    assert (wide.freed, wide.moves) == (2, 2)
    assert wide.after.spread_excess == 1 and wide.violations == ["web/api's spread over the MSBs of dc1 made worse"]


def test_high_node_utilization_places_evicted_tasks_on_the_fullest_machine():
    side = high_node(region(), churn=1.0)
    # a (6 % < 20 %) and c (12 %): underutilized; their tasks go to the fullest machine of the dc
    # that holds them (b: 4 cores free)
    assert side.freed == 2 and side.moves == 2, side
    assert side.after.spread_excess > 0 and side.violations, "both api tasks in msb1: the spread made worse"


def test_the_least_moves_bound_takes_the_machines_holding_fewest_tasks_that_the_totals_spare():
    """x holds 2 tasks, y 3, z 1 (15 of 48 cores in all): one 16-core machine could hold them, so
    two may be freed, at 1 + 2 moves at least; three cannot. The other group (one machine full)
    spares none."""
    ms = [Machine(n, "web", "dc1", "msb1", 16_000, 65_536, rack="r1") for n in "xyz"]
    tasks = [Task("web/a", i, "x", 1000, 1024) for i in range(2)] + [Task("web/b", i, "y", 1000, 1024) for i in range(3)]
    tasks.append(Task("web/c", 0, "z", 10_000, 1024))
    full = Machine("f", "web", "dc1", "msb2", 16_000, 65_536, rack="r2")
    reg = Region([Group("web", "dc1", "msb1", ms, tasks), Group("web", "dc1", "msb2", [full], [Task("web/d", 0, "f", 16_000, 1024)])],
                 {("dc1", "msb1"): 48_000, ("dc1", "msb2"): 16_000})
    assert [least_moves(reg, n) for n in (1, 2, 3)] == [1, 3, None]


def test_the_least_cooling_bound_takes_each_hot_msbs_hottest_tasks_until_they_cover_its_excess():
    """msb1 uses 6 cores (six tasks of 1) of 16, msb2 and msb3 none: the mean is 6/48 of a core a
    core, so at a 10 % margin an MSB may use 2.2 cores: msb1 has 3.8 too many, which three tasks do
    not cover and four do. The hotspots goal makes those four moves (two to each cool MSB); at a
    500 % margin nothing is hot."""
    ms = [Machine(n, "web", "dc1", msb, 16_000, 65_536, rack=f"r{n}") for n, msb in (("a", "msb1"), ("b", "msb2"),
                                                                                     ("c", "msb3"))]
    hot = [Task("web/x", i, "a", 1000, 1024, used=1000) for i in range(6)]
    idle = [Task("web/y", i, mid, 1000, 1024, used=0) for i, mid in enumerate("bc")]
    reg = Region([Group("web", "dc1", m.msb, [m], [t for t in hot + idle if t.machine == m.id]) for m in ms],
                 {("dc1", m.msb): 16_000 for m in ms})
    assert least_cooling(reg, 0.10) == 4
    assert least_cooling(reg, 5.0) == 0
    assert len(msb_hotspots(Board(reg, 1.0, margin=0.10))) == 4


LAST = re.compile(r"rebalancer: freed (\d+) machines \(ca scale-down (\d+), entitlement-wide \d+, highnodeutilization \d+\) "
                  r"with (\d+) moves \(ca scale-down (\d+)\); spread excess (\d+) \(ca scale-down (\d+)\); hottest MSB "
                  r"x\d\.\d\d of mean; violations (\d+) \(baselines \d+\); solve \d+\.\d s")


def test_the_bench_ends_with_the_issues_line_for_the_round_within_the_autoscalers_moves():
    """A small run (1,000 machines): its last line is the issue's, word for word, of the round whose
    budget is the autoscaler's moves (never more moves, no violation, no spread made worse), and
    the line before it of the round without a budget."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_rebalancer.py"), "--machines", "1000"],
                         capture_output=True, text=True, timeout=600, check=True).stdout.splitlines()
    budgeted, free = LAST.fullmatch(out[-1]), LAST.fullmatch(out[-2])
    assert budgeted and free, out[-3:]
    freed, ca_freed, moves, ca_moves, excess, ca_excess, violations = map(int, budgeted.groups())
    assert moves <= ca_moves and violations == 0 and excess <= ca_excess and freed > 0
    assert f"?max_moves={ca_moves}" in "\n".join(out)
