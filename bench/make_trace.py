"""Load traces for bench_srm.py --trace: CSV rows of `seconds,load` (load in CPU cores), one a minute.

    .venv/bin/python bench/make_trace.py bursty /tmp/bursty.csv [--weeks 2] [--seed 36]

bursty: no daily or weekly shape. A base of about 20 cores that wanders (a slow random walk held
between 12 and 30), AR(1) noise, and bursts at random: on average one every 3 hours (Poisson
arrivals), each lasting 5-90 minutes (exponential, mean 25) at 1.5-4x the base, rising over 2
minutes and falling over 5. Each week's bursts fall at other times, so last week says little about
this one: a forecast from history helps little and must not hurt. With --weeks 2, bench_srm.py
takes the first week as the history and measures the second.
"""

from __future__ import annotations

import argparse
import random
import sys

WEEK = 7 * 24 * 60


def bursty(weeks: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    minutes = weeks * WEEK
    base, level, noise = [], 20.0, 0.0
    for _ in range(minutes):
        level = min(30.0, max(12.0, level + rng.gauss(0, 0.15)))
        noise = 0.9 * noise + rng.gauss(0, 0.03)
        base.append(level * (1 + noise))
    factor = [1.0] * minutes
    t = rng.expovariate(1 / 180)
    while t < minutes:
        start, length, height = int(t), max(5, min(90, round(rng.expovariate(1 / 25)))), rng.uniform(1.5, 4.0)
        for m in range(start, min(minutes, start + length + 5)):
            k = m - start
            shape = min(1.0, (k + 1) / 2) if k < length else max(0.0, 1 - (k - length + 1) / 5)
            factor[m] = max(factor[m], 1 + (height - 1) * shape)
        t += rng.expovariate(1 / 180)
    return [b * f for b, f in zip(base, factor)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=["bursty"])
    p.add_argument("out", help="the CSV to write (- for standard output)")
    p.add_argument("--weeks", type=int, default=2)
    p.add_argument("--seed", type=int, default=36)
    args = p.parse_args()
    if args.weeks < 1:
        p.error("--weeks: at least 1")
    load = bursty(args.weeks, args.seed)
    f = sys.stdout if args.out == "-" else open(args.out, "w")
    try:
        f.write(f"# bench/make_trace.py {args.shape} --weeks {args.weeks} --seed {args.seed}: seconds,load (cores)\n")
        for m, x in enumerate(load):
            f.write(f"{m * 60},{x:.3f}\n")
    finally:
        if f is not sys.stdout:
            f.close()


if __name__ == "__main__":
    main()
