"""bench/bench_capacity.py's own rules (issue #37): a reclaim with notice hands the machine over
when the batch controller acks and batch never takes a machine owed to a service; a failure's
reclaim kills at once and loses the work since the last checkpoint; the disruption budget bounds
what is in flight; and the last line is the issue's, word for word."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_capacity as bc  # noqa: E402

LAST = re.compile(r"capacity: utilisation \d+% \(no opportunistic tier \d+%, k8s priority \d+%\); opportunistic "
                  r"availability \d+\.\d% \(offered SLO 99%\); reclaims with >= 120 s notice \d+% \(k8s 0%\); "
                  r"guaranteed over-target minutes \d+ \(without the tier \d+\)")


def test_a_killed_batch_task_loses_what_it_did_since_its_last_checkpoint():
    assert bc.lost_work(0.0, 15 * 60) == pytest.approx(5 * 60 * bc.BATCH_USE)  # checkpointed at 10 min
    assert bc.lost_work(0.0, 10 * 60) == 0.0
    assert bc.lost_work(100.0, 50.0) == 0.0, "not started yet: nothing done"


def test_a_reclaim_with_notice_hands_the_machine_over_at_the_ack_and_batch_keeps_off_it():
    pool = bc.TierPool(4, tier=True)
    pool.fill(0.0)
    assert (pool.free, len(pool.batch), pool.available()) == (0, 4, 4)
    t = bc.Tally("t")
    pool.reclaim(1, 100.0, t, failure=False)
    assert (t.reclaims, t.noticed, len(pool.batch), pool.available()) == (1, 1, 3, 3)
    pool.acks(100.0 + bc.ACK - 1)
    assert pool.free == 0, "not before the controller acks"
    pool.acks(100.0 + bc.ACK)
    pool.fill(100.0 + bc.ACK)
    assert (pool.free, pool.promised, len(pool.batch)) == (1, 1, 3), "the acked machine is the service's"
    assert pool.available() == 3
    assert pool.take() is not None and (pool.free, pool.promised, pool.held) == (0, 0, 1)
    assert t.lost == 0.0


def test_a_failure_reclaims_at_once_without_notice_and_loses_work():
    pool = bc.TierPool(2, tier=True)
    pool.fill(0.0)
    t = bc.Tally("t")
    now = bc.STARTUP + 15 * 60  # the tasks have run 15 minutes
    pool.reclaim(1, now, t, failure=True)
    assert (t.reclaims, t.noticed, pool.free, pool.promised) == (1, 0, 1, 1)
    assert t.lost == pytest.approx(bc.SLOTS * 5 * 60 * bc.BATCH_USE)


def test_reclaims_in_flight_stay_within_the_budget():
    pool = bc.TierPool(40, tier=True)
    pool.fill(0.0)
    t = bc.Tally("t")
    pool.reclaim(30, 0.0, t, failure=False)
    assert len(pool.reclaiming) == 10, "at most 10 machines (reclaim.Budget's default) in flight"
    small = bc.TierPool(6, tier=True)
    small.fill(0.0)
    small.reclaim(6, 0.0, t, failure=False)
    assert len(small.reclaiming) == 3, "and at most half the entitlement"


def test_the_reserve_is_kept_from_batch_taken_at_once_and_refilled_with_notice():
    pool = bc.TierPool(10, tier=True, reserve=2)
    pool.fill(0.0)
    assert (pool.free, len(pool.batch), pool.available()) == (2, 8, 8), "the reserve is not lent, nor available"
    t = bc.Tally("t")
    assert pool.take() and pool.take() and pool.free == 0, "growth takes the reserve at once"
    pool.refill(10.0, t)
    assert (t.reclaims, t.noticed, len(pool.reclaiming), pool.owed(bc.RESERVE)) == (2, 2, 2, 2)
    pool.refill(11.0, t)
    assert t.reclaims == 2, "those coming are counted"
    pool.acks(10.0 + bc.ACK)
    assert (pool.free, pool.promised, len(pool.batch)) == (2, 0, 6), "back to the pool, promised to nobody"
    pool.fill(30.0)
    assert len(pool.batch) == 6, "and kept from batch"


def test_without_the_tier_free_machines_stay_free():
    pool = bc.TierPool(3, tier=False)
    pool.fill(0.0)
    assert (pool.free, len(pool.batch), pool.available()) == (3, 0, 3)


def test_the_last_line_is_the_issues():
    out = subprocess.run([sys.executable, str(REPO / "bench/bench_capacity.py"), "--jobs", "2", "--days", "1.5"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    lines = out.strip().splitlines()
    assert LAST.fullmatch(lines[-1]), lines[-1]
    assert any(line.startswith("k8s ") for line in lines) and any(line.startswith("no tier ") for line in lines)


def test_on_a_flat_load_each_way_counts_what_it_should():
    """One service of 2.4 cores (4 tasks at the 0.6 target: one machine) in a region of 3 machines,
    2 hours, no failure: the tier and Kubernetes both run batch on the other 8 slots (useful 2.4 +
    8 x 0.95 = 10 cores of 12 held), without the tier 2.4 of the service's 4; nothing reclaimed."""
    loads = [[2.4] * 120]
    tier = bc.run_twine(loads, None, 120, 3, tier=True, failure_at=None, reserve=0)
    none = bc.run_twine(loads, None, 120, 3, tier=False, failure_at=None)
    k8s = bc.run_k8s(loads, 120, 3, failure_at=None)
    assert tier.utilisation == pytest.approx(10 / 12) and k8s.utilisation == pytest.approx(10 / 12)
    assert none.utilisation == pytest.approx(0.6)
    assert (tier.reclaims, k8s.reclaims, tier.lost, k8s.lost, tier.over, k8s.over) == (0, 0, 0, 0, 0, 0)
    assert set(tier.hours.values()) == {2} and set(none.hours.values()) == {2}, "2 machines available all along"


def test_an_msb_lost_takes_batch_machines_with_it_and_its_replacements_reclaim_without_notice():
    """20 tasks (5 machines) in a region of 10; a fifth of every machine lost at minute 35 for an
    hour: one service machine (4 tasks) and one batch machine go down; the 4 tasks are placed again
    at once on a batch machine reclaimed without notice; both batch machines' work since their last
    checkpoint (at 30 min: 5 minutes of 4 tasks each) is lost. Kubernetes: 4 of 20 service pods and
    4 of 20 batch pods lost, the 4 pods made again preempt 4 batch pods (which checkpoint)."""
    loads = [[12.0] * 120]
    lost = 5 * 60 * bc.BATCH_USE  # a task's, since its checkpoint at 30 min
    tier = bc.run_twine(loads, None, 120, 10, tier=True, failure_at=35, reserve=0)
    assert tier.reclaims - tier.noticed == 1, "one reclaim without notice"
    assert tier.lost == pytest.approx(2 * bc.SLOTS * lost)
    # available (free and batch): 5 before; during, 10 less 2 down less the service's 5 (4 left and 1 reclaimed)
    assert tier.starts[bc.T0 // 3600] == 5 and tier.hours[bc.T0 // 3600] == 3
    # the failure-domain buffer at the hour's start: the one service machine the MSB's loss then took
    assert tier.buffers[bc.T0 // 3600] == 1
    k8s = bc.run_k8s(loads, 120, 10, failure_at=35)
    assert k8s.reclaims >= 4 and k8s.noticed == 0
    assert k8s.lost == pytest.approx(4 * lost)


def test_the_gap_to_kubernetes_is_the_service_machines_empty_slots_and_the_services_sizes():
    """One service of 1.8 cores (3 tasks at the 0.6 target, one machine with a slot left) in a region
    of 3 machines, 2 hours: the tier lends the 2 other machines whole and leaves that slot empty;
    Kubernetes puts a batch pod in it. Same sizes on both sides: the whole gap is the empty slot's
    batch work (0.95 of a core in 12 held), and the gap's line says so."""
    loads = [[1.8] * 120]
    tier = bc.run_twine(loads, None, 120, 3, tier=True, failure_at=None, reserve=0)
    k8s = bc.run_k8s(loads, 120, 3, failure_at=None)
    assert tier.empty / tier.held == pytest.approx(1 / 12)
    assert k8s.utilisation - tier.utilisation == pytest.approx(bc.BATCH_USE / 12)
    line = bc.gap(tier, k8s)
    assert f"about {100 * bc.BATCH_USE / 12:.1f} from the service machines' empty slots" in line, line
    assert "about 0.0 from the services' sizes" in line, line


def test_the_oracle_sizes_each_service_from_the_true_load_ahead_at_the_target():
    """A load of 1.2 cores, rising to 4.8 at minute 30 (2 tasks, then 8): the oracle asks for 8
    when tasks asked for at the next step would serve in the minute of the rise (the reclaim's ack
    and a start-up later), not after the measurement shows it, and never runs over target; the
    SRM, reacting to the measured load, does."""
    loads = [[1.2] * 30 + [4.8] * 30]
    best = bc.run_twine(loads, None, 60, 4, tier=True, failure_at=None, reserve=0, oracle=True)
    srm = bc.run_twine(loads, None, 60, 4, tier=True, failure_at=None, reserve=0)
    assert best.name == "oracle" and best.over == 0
    assert srm.over > 0
    job = {"load": [1.2] * 30 + [4.8] * 30, "sim": bc.JobSim(bc.Pool(4), "j"), "ready": []}
    assert bc.oracle_size(job, 28 * 60.0) == 2, "the rise is beyond a step, an ack and a start-up"
    assert bc.oracle_size(job, 28 * 60.0 + 45) == 8, "tasks asked for at the next step serve in the rise's minute"
