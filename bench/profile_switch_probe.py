"""Runs on the kernel being measured (the host, or a VM over SSH with the VM's own twine install):
switches between two profiles `--switches` times with the agent's profile engine, the function the
agent calls to apply a machine's profile, and prints one JSON line per series with each switch's
engine-measured seconds and the outcome of every setting. Rolls back at the end: the kernel is
left as it was.

    python profile_switch_probe.py --dir PROFILES --state DIR --series NAME:A:B [...] --switches 12
"""

from __future__ import annotations

import argparse
import json
import sys

from agent.profiles.appliers.base import HostContext
from agent.profiles.engine import Engine


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--series", action="append", required=True, metavar="NAME:A:B")
    ap.add_argument("--switches", type=int, default=12)
    ap.add_argument("--task-cgroup", default="twine.slice")
    args = ap.parse_args()
    engine = Engine(HostContext(task_cgroup=args.task_cgroup), args.state, search=(args.dir,))
    try:
        for series in args.series:
            name, a, b = series.split(":")
            first = engine.apply(a)  # not timed: from the host as it was to A
            if not first.ok:
                print(json.dumps({"series": name, "error": first.error}))
                return 1
            seconds, outcomes = [], {}
            for i in range(args.switches):
                report = engine.apply(b if i % 2 == 0 else a)
                if not report.ok:
                    print(json.dumps({"series": name, "error": report.error}))
                    return 1
                seconds.append(report.seconds)
                for r in report.results:
                    outcomes.setdefault(r.setting_id.split("=")[0], set()).add(r.outcome.value)
            print(json.dumps({"series": name, "seconds": seconds,
                              "outcomes": {k: sorted(v) for k, v in outcomes.items()}}), flush=True)
            engine.rollback()
    finally:
        engine.rollback()
    return 0


if __name__ == "__main__":
    sys.exit(main())
