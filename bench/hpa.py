"""The Kubernetes HorizontalPodAutoscaler's algorithm (autoscaling/v2), a baseline for bench_srm.py,
written from the Kubernetes documentation ("Horizontal Pod Autoscaling": algorithm details, and
the `behavior` field's defaults), with its documented defaults:

- desiredReplicas = ceil(currentReplicas x currentMetricValue / desiredMetricValue), where the
  metric is the average utilization over the pods; no change while the ratio is within the
  tolerance (0.1) of 1.0;
- pods not yet ready, and pods without a metric, are set aside: on a scale-up they count as 0 % of
  the target, on a scale-down pods without a metric count as 100 % (not-ready ones are left out);
  if that reverses the direction or brings the ratio within the tolerance, nothing changes;
- no metric at all: nothing changes (the HPA reports it cannot compute a size);
- scale-down stabilization: the highest recommendation of the last 300 s is used;
- scale-up at most max(100 %, 4 pods) per 15 s; scale-down at most 100 % per 15 s;
- clamped to [minReplicas, maxReplicas]; the controller syncs every 15 s.

Not Kubernetes' code: the same rules, written here for the benchmark."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

TOLERANCE = 0.1
SYNC = 15.0
DOWN_WINDOW = 300.0
UP_PERCENT, UP_PODS, UP_PERIOD = 100, 4, 15.0
DOWN_PERCENT, DOWN_PERIOD = 100, 15.0


@dataclass
class Hpa:
    min_replicas: int
    max_replicas: int
    target: float  # utilization of the request, 0.6 = 60 %
    recommendations: deque = field(default_factory=deque)  # (at, replicas) of the stabilization window
    changes: deque = field(default_factory=deque)  # (at, delta) of the scaling policies' periods

    def desired(self, now: float, current: int, ready: list[float | None], not_ready: int = 0) -> int:
        """The replica count after this sync. `ready`: each ready pod's utilization (None: no
        metric for it); `not_ready`: pods started but not ready yet."""
        measured = [u for u in ready if u is not None]
        if not measured:
            return current  # no metric: the HPA cannot compute; nothing changes
        ratio = sum(measured) / len(measured) / self.target
        missing = len(ready) - len(measured)
        base = len(ready)  # the pods the ratio is over
        if missing or not_ready:
            if ratio > 1:  # a scale-up: the missing and the not-ready count as 0 %
                base = len(ready) + not_ready
                ratio = sum(measured) / base / self.target
                if ratio <= 1:
                    ratio = 1.0
            elif ratio < 1 and missing:  # a scale-down: the missing count as 100 % (not-ready left out)
                ratio = (sum(measured) + missing * 1.0) / (len(measured) + missing) / self.target
                if ratio >= 1:
                    ratio = 1.0
        if abs(ratio - 1.0) <= TOLERANCE:
            raw = current
        else:
            raw = math.ceil(base * ratio - 1e-9)
        return self._behave(now, current, max(self.min_replicas, min(self.max_replicas, raw)))

    def _behave(self, now: float, current: int, recommended: int) -> int:
        w = self.recommendations
        w.append((now, recommended))
        while w and w[0][0] <= now - DOWN_WINDOW:
            w.popleft()
        # stabilization: up at once (its window is 0 s); down to the highest recommendation of 300 s
        down = max(r for _, r in w)
        new = recommended if recommended > current else (down if down < current else current)
        ch = self.changes
        while ch and ch[0][0] <= now - max(UP_PERIOD, DOWN_PERIOD):
            ch.popleft()
        if new > current:  # at most max(100 %, 4 pods) more than at the period's start
            start = current - sum(d for t, d in ch if d > 0 and t > now - UP_PERIOD)
            new = min(new, max(start + start * UP_PERCENT // 100, start + UP_PODS))
        elif new < current:  # at most 100 % fewer
            start = current - sum(d for t, d in ch if d < 0 and t > now - DOWN_PERIOD)
            new = max(new, start - start * DOWN_PERCENT // 100)
        new = max(self.min_replicas, min(self.max_replicas, new))
        if new != current:
            ch.append((now, new - current))
        return new
