"""What a replica's usage book holds and spends for the reports of the machines whose heartbeats
reach it (issue #38): controlplane/usage/book.py, in one process, no HTTP.

N machines each report 20 tasks of 4 jobs the region has (as bench_region_scale's agents do), every
report a freshly decoded JSON body (msgspec, as the API hands it on) with other figures than the
last, and its machine's cell a tuple made for it (the daemon's cell_of() makes one each heartbeat). Measured, after two reports of each machine:

    held      bytes the book holds a machine (tracemalloc: what its reports left allocated),
              against a baseline in the same run: the decoded bodies themselves, what keeping each
              machine's last report as it came would hold;
    note      microseconds of one UsageBook.note (a heartbeat's share of it), against a baseline in
              the same run: msgspec decoding the same body;
    tasks     milliseconds of one book.tasks() of every job (what a ReBalancer round asks of each
              replica) and of one job (a job's usage answer), the tasks held N x 20; and the longest
              stretch between two pauses of tasks_stepwise() (the replica asks that way on its event
              loop), of three asks of every job;
    sweep     milliseconds of one book.sweep() with no machine stale (each replica's, once a second),
              against a baseline in the same run: a pass over every machine held (the sweep until 3469a66).

    .venv/bin/python bench/bench_usage_book.py [--machines 25000]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import timeit
import tracemalloc
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.daemon.stalls import tune_collector  # noqa: E402
from controlplane.usage.book import STEP_TASKS, UsageBook  # noqa: E402

CELL = ("dc0", "msb0000", "s0-e0", "", "t1")
JOBS = [f"s0-e0/j{i}" for i in range(4)]


def body(k: int) -> bytes:
    return msgspec.json.encode({"window": 10.0, "cpus": 32, "cpu": 7.25, "memory_mb": 40960.0,
                                "memory_total_mb": 131072.0, "power_w": None,
                                "tasks": [[JOBS[i % 4], i, 0.31 + i / 100 + k / 1000, 512.0 + i] for i in range(20)]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=25_000)
    args = ap.parse_args()
    n = args.machines
    raws = [body(k) for k in range(50)]
    mids = [f"m{i:07d}" for i in range(n)]
    known = set(JOBS)
    book = UsageBook(stale=1e9)

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = [msgspec.json.decode(raws[i % 50]) for i in range(n)]  # the baseline: each last body as it came
    bodies = tracemalloc.take_snapshot()
    del kept
    start = tracemalloc.take_snapshot()
    for r in range(2):
        for i, mid in enumerate(mids):
            # its cell a tuple of its own, as the daemon's cell_of() makes one each heartbeat
            book.note(mid, (*CELL,), msgspec.json.decode(raws[(i + r) % 50]), known, time.monotonic())
    held = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in held.compare_to(start, "filename")) / n
    base = sum(s.size_diff for s in bodies.compare_to(before, "filename")) / n

    decoded = [msgspec.json.decode(raws[i % 50]) for i in range(1000)]
    rounds = 20_000
    at = [0]

    def note() -> None:
        at[0] += 1
        book.note(mids[at[0] % n], (*CELL,), decoded[at[0] % 1000], known, time.monotonic())

    note_us = timeit.timeit(note, number=rounds) / rounds * 1e6
    decode_us = timeit.timeit(lambda: msgspec.json.decode(raws[0]), number=rounds) / rounds * 1e6
    every = timeit.timeit(lambda: book.tasks(), number=3) / 3 * 1000
    one = timeit.timeit(lambda: book.tasks([JOBS[1]]), number=3) / 3 * 1000
    # as the daemon runs: what it read at start frozen out of the full collections, those made a
    # tenth as often (daemon/stalls.py tune_collector)
    gc.freeze()
    tune_collector()
    longest = 0.0  # the longest stretch between two of tasks_stepwise's pauses (what the event loop waits)
    for _ in range(3):
        steps, t0 = book.tasks_stepwise(), time.perf_counter()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                answer = done.value  # (freed after the clock: the asker frees it once used, not in this step)
                break
            finally:
                t1 = time.perf_counter()
                longest, t0 = max(longest, t1 - t0), t1
        del answer
    sweep_ms = timeit.timeit(lambda: book.sweep(time.monotonic()), number=20) / 20 * 1000  # nothing stale (1e9 s)
    # the baseline: the pass over every machine the sweep made before it read the book in report order
    def full_pass(now: float) -> list[str]:
        return [mid for mid, h in book.machines.items() if now - h.at > book.stale]

    pass_ms = timeit.timeit(lambda: full_pass(time.monotonic()), number=20) / 20 * 1000
    print(f"{n:,} machines of 20 tasks each (4 jobs), two reports each")
    print(f"held: {size:.0f} bytes a machine; baseline, its last body as decoded: {base:.0f} (ratio {size / base:.2f})")
    print(f"note: {note_us:.1f} us a report; baseline, decoding it: {decode_us:.1f} us (ratio {note_us / decode_us:.1f})")
    print(f"tasks(): every job's {every:.0f} ms ({n * 20:,} tasks; asked on the event loop, in slices of "
          f"{STEP_TASKS:,} tasks: the longest {longest * 1000:.0f} ms), one job's {one:.0f} ms ({n * 5:,} tasks)")
    print(f"sweep: {sweep_ms:.3f} ms with none of the {n:,} machines stale (a replica's, once a second); baseline, "
          f"a pass over every machine: {pass_ms:.3f} ms (ratio {sweep_ms / pass_ms:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
