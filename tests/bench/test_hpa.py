"""The benchmark's Kubernetes HPA baseline (bench/hpa.py) on the examples of the Kubernetes
documentation ("Horizontal Pod Autoscaling", algorithm details and the behavior defaults)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from hpa import Hpa  # noqa: E402


def hpa() -> Hpa:
    return Hpa(min_replicas=1, max_replicas=100, target=0.5)


def test_double_when_the_metric_is_twice_the_target_and_halve_at_half():
    # "if the current metric value is 200m, and the desired value is 100m, the number of replicas will be doubled"
    assert hpa().desired(0, 4, [1.0] * 4) == 8
    # "If the current value is instead 50m, you'll halve the number of replicas"
    assert hpa().desired(0, 4, [0.25] * 4) == 2


def test_within_the_tolerance_nothing_changes():
    # "The control plane skips any scaling action if the ratio is sufficiently close to 1.0 (within ... 0.1)"
    assert hpa().desired(0, 10, [0.54] * 10) == 10
    assert hpa().desired(0, 10, [0.46] * 10) == 10
    assert hpa().desired(0, 10, [0.56] * 10) == 12  # ratio 1.12


def test_scale_up_is_at_most_max_of_100_percent_and_4_pods_per_15_s():
    h = hpa()
    assert h.desired(0, 1, [5.0]) == 5, "from 1: max(1 + 100 %, 1 + 4) = 5"
    assert h.desired(5, 5, [5.0] * 5) == 5, "the same 15 s period: nothing more"
    assert h.desired(15, 5, [5.0] * 5) == 10, "the next period: 5 + 100 %"


def test_scale_down_takes_the_highest_recommendation_of_300_s():
    h = hpa()
    assert h.desired(0, 10, [0.5] * 10) == 10
    assert h.desired(15, 10, [0.25] * 10) == 10, "10 was recommended within 300 s"
    assert h.desired(299, 10, [0.25] * 10) == 10
    assert h.desired(301, 10, [0.25] * 10) == 5, "the 10 left the window: the highest left is 5"


def test_missing_metrics_count_as_0_percent_up_and_100_percent_down():
    # 4 pods at 50 % target, 3 report 90 %, one none: a scale-up computed with the missing at 0 %
    assert hpa().desired(0, 4, [0.9, 0.9, 0.9, None]) == 6  # (2.7 + 0) / 4 / 0.5 = 1.35 -> ceil(5.4)
    # a scale-down with the missing at 100 %: 3 at 10 % and one missing: (0.3 + 1.0) / 4 / 0.5 = 0.65
    assert hpa().desired(0, 4, [0.1, 0.1, 0.1, None]) == 3
    # not-ready pods count as 0 % on a scale-up, which here brings the ratio to 1: nothing changes
    assert hpa().desired(0, 6, [0.6, 0.6, 0.6], not_ready=3) == 6


def test_without_any_metric_nothing_changes_and_min_max_clamp():
    assert hpa().desired(0, 7, [None] * 7) == 7
    assert Hpa(min_replicas=3, max_replicas=6, target=0.5).desired(0, 4, [0.05] * 4) == 3
    assert Hpa(min_replicas=3, max_replicas=6, target=0.5).desired(0, 4, [2.0] * 4) == 6
