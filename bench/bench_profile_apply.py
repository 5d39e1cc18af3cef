"""End-to-end time of `twine-agent profile apply` for a sysctl-only profile, on the real kernel.

Switches the host back and forth between two sysctl-only profiles with the real CLI (a new process
each time, as an operator or a script would run it), and prints the figures beside a baseline
measured in the same run: the bare start-up of the same Python interpreter (`python -c pass`).
Target (issue #2): under 0.5 s end to end. The host's sysctls are restored at the end.

    .venv/bin/python bench/bench_profile_apply.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEYS = {
    "net.core.somaxconn": (1024, 2048),
    "net.ipv4.tcp_fin_timeout": (20, 25),
    "net.ipv4.tcp_keepalive_time": (600, 900),
    "net.core.netdev_max_backlog": (2000, 3000),
    "vm.swappiness": (20, 30),
    "vm.dirty_ratio": (15, 25),
    "vm.dirty_background_ratio": (5, 8),
    "net.ipv4.tcp_max_syn_backlog": (2048, 4096),
}


def path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
    return time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    saved = {k: path(k).read_text() for k in KEYS}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(("bench-a", "bench-b")):
            body = "[sysctl]\n" + "".join(f'"{k}" = {v[i]}\n' for k, v in KEYS.items())
            Path(tmp, f"{name}.toml").write_text(body)
        cli = [sys.executable, "-m", "agent", "--state-dir", f"{tmp}/state", "profile"]
        try:
            baseline = [timed([sys.executable, "-c", "pass"], env) for _ in range(args.rounds)]
            switches = [timed([*cli, "apply", f"{tmp}/bench-{'ab'[i % 2]}.toml"], env) for i in range(args.rounds)]
            for k, (a, b) in KEYS.items():  # the last switch really landed
                assert path(k).read_text().strip() == str((a, b)[(args.rounds - 1) % 2]), k
            subprocess.run([*cli, "rollback"], check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
        finally:
            for k, text in saved.items():
                if path(k).read_text() != text:
                    path(k).write_text(text)
    assert all(path(k).read_text() == t for k, t in saved.items()), "host not restored"
    b_med, s_med, s_p90 = statistics.median(baseline), statistics.median(switches), pct(switches, 0.9)
    print(f"profile apply, {len(KEYS)} sysctls, {args.rounds} switches (new process each)")
    print(f"  baseline python -c pass : median {b_med * 1000:7.1f} ms")
    print(f"  twine-agent profile apply: median {s_med * 1000:7.1f} ms  p90 {s_p90 * 1000:7.1f} ms  max {max(switches) * 1000:7.1f} ms")
    print(f"  ratio to baseline        : median {s_med / b_med:5.2f}x  p90 {s_p90 / b_med:5.2f}x")
    print(f"  target < 500 ms end to end: {'met' if s_p90 < 0.5 else 'NOT met'} (p90 {s_p90 * 1000:.1f} ms)")
    return 0 if s_p90 < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
