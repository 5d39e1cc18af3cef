"""What measuring usage costs the agent (issue #25: the sampling of 50 tasks under 5 ms of agent CPU).

N real containers (Debian's busybox, sleeping) run under the real Docker daemon; the agent's
sampler (agent/usage.py) reads their cgroups and the host's /proc files as a heartbeat does, R
times, back to back. Measured: the CPU time of this process per sample (time.process_time: what
the agent's own process would spend), against a baseline taken in the same run: the same
sampler with no task (the host's figures alone), so the per-task part is seen apart; and apart,
the first sample, which finds each task's cgroup. Sleeping tasks and samples back to back are
the cheap case for the kernel's counters: busy tasks cost it a little more to read.

    .venv/bin/python bench/bench_usage.py [--tasks 50] [--rounds 400]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.models import TaskSpec  # noqa: E402
from agent.runtime.docker_runtime import DockerRuntime  # noqa: E402
from agent.usage import Running, Sampler  # noqa: E402

IMAGE = "twine/busybox:1"  # scripts/build-images.sh


def cpu_per_sample(sampler: Sampler, running: list[Running], rounds: int) -> tuple[float, float]:
    """Seconds of this process's CPU for the first sample (each task's cgroup found) and per
    sample after it, each a window after the last (a made-up clock: samples back to back)."""
    now = 1000.0
    t0 = time.process_time()
    sampler.sample(running, now=now)
    first = time.process_time() - t0
    t0 = time.process_time()
    for _ in range(rounds):
        now += 1.0
        usage = sampler.sample(running, now=now)
    spent = time.process_time() - t0
    assert usage is not None and len(usage["tasks"]) == len(running), "every task measured"
    return first, spent / rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=50)
    p.add_argument("--rounds", type=int, default=400)
    args = p.parse_args()
    machine = "bench-usage-" + uuid.uuid4().hex[:8]
    rt = DockerRuntime(pull="never")

    async def start_all() -> None:
        for i in range(args.tasks):
            spec = TaskSpec(job="bench/usage", index=i, spec_version=1, image=IMAGE, command=("sleep", "600"),
                            cpus=0.01, memory_mb=8, network_mode="none")
            await rt.start(machine, spec, 1)

    try:
        asyncio.run(start_all())
        listed = asyncio.run(rt.list(machine))
        running = [Running(c.id, c.pid, c.task.job, c.task.index) for c in listed if c.running and c.pid > 0]
        assert len(running) == args.tasks, f"{len(running)} of {args.tasks} containers running"
        _, host_only = cpu_per_sample(Sampler(), [], args.rounds)
        first, with_tasks = cpu_per_sample(Sampler(), running, args.rounds)
    finally:
        for c in asyncio.run(rt.list(machine)):
            asyncio.run(rt.remove(c.id))
    print(f"{args.tasks} containers running (sleeping); {args.rounds} samples each way, back to back; CPU time of "
          f"the sampling process; cgroup v{2 if Sampler().v1.get('cpuacct') is None else 1}")
    print(f"baseline, the host's figures alone: {host_only * 1e3:7.3f} ms a sample")
    print(f"the host and {args.tasks} tasks' cgroups:   {with_tasks * 1e3:7.3f} ms a sample "
          f"({with_tasks / host_only:.1f} x the baseline; {(with_tasks - host_only) / args.tasks * 1e6:.0f} us a task)")
    print(f"the first sample, finding the {args.tasks} cgroups: {first * 1e3:.2f} ms")
    print(f"sampling {args.tasks} tasks: {with_tasks * 1e3:.2f} ms of agent CPU a sample once their cgroups are "
          f"known, {with_tasks / 0.005:.2f} of the 5 ms allowed")

if __name__ == "__main__":
    main()
