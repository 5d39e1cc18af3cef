"""A job's autoscaling policy (issue #26), as the job record holds it: the SRM (controlplane/srm/)
sizes a job that has one."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from controlplane.store.errors import ApiError


@dataclass(frozen=True, slots=True)
class Metric:
    """An autoscaled job's load other than its CPU: the value of a Prometheus query (on the region's
    server, controld --prometheus-url) or the number a URL of the job's own answers; `target` is
    the load one task should carry."""

    target: float
    prometheus: str | None = None
    http: str | None = None


@dataclass(frozen=True, slots=True)
class Autoscale:
    """A job's autoscaling policy (the SRM: controlplane/srm/). The defaults are the README's."""

    min: int = 1
    max: int = 10
    target_cpu: float = 0.6  # of each task's cpus
    tolerance: float = 0.1  # no change while load per task is within target x (1 +- tolerance)
    predictive: bool = True  # the job's history (same time yesterday, last week) sets a floor
    scale_down_after: float = 300.0  # seconds of measured load below the size before it shrinks
    max_changes_per_hour: int = 6  # the flap budget (a scale-out for measured overload is never held)
    metric: Metric | None = None

    @classmethod
    def parse(cls, data: dict) -> Autoscale:
        """From a body's autoscale (schema.Autoscale); ApiError names the field."""
        m = data.get("metric")
        metric = None
        if m is not None:
            if (m.get("prometheus") is None) == (m.get("http") is None):
                raise ApiError("unprocessable", "autoscale.metric", "give one of prometheus (a query) or http (a URL)")
            metric = Metric(float(m["target"]), m.get("prometheus"), m.get("http"))
        out = cls(**{k: v for k, v in data.items() if k != "metric"}, metric=metric)
        if out.min > out.max:
            raise ApiError("unprocessable", "autoscale.min", f"{out.min} is above autoscale.max {out.max}")
        return replace(out, target_cpu=float(out.target_cpu), tolerance=float(out.tolerance),
                       scale_down_after=float(out.scale_down_after))

    def to_json(self) -> dict:
        return msgspec.to_builtins(self)

    @classmethod
    def from_json(cls, d: dict | None) -> Autoscale | None:
        if d is None:
            return None
        m = d.get("metric")
        return cls(**{**d, "metric": None if m is None else Metric(**m)})
