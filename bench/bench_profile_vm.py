"""A host profile switch on a VM's own kernel, beside the same switch on this host, in one run.

Brings up the Vagrant region (vagrant/Vagrantfile, one machine VM; or uses the one that is up
with --no-up), stops the agent on the VM (so that it does not undo the profiles), and on each
kernel switches back and forth between two profiles with the agent's profile engine
(bench/profile_switch_probe.py): `--switches` switches per series, each timed by the engine
(read, save originals, write, verify every setting; journal included), not the Python start-up.

Series:
  sysctl+irq+cgroup-cpu  4 sysctls, every virtio-net queue IRQ pinned to CPU 0 <-> CPU 1, and the
                         cgroup v2 cpu controller on <-> off for twine.slice (irqbalance held off)
  hugepages-2M           the 2 MiB huge page pool 16 <-> 48 pages

On this host the cgroup cpu switch is not applicable (cgroup v1) and irqbalance is not under
systemd: the host's column measures the settings that apply here, and the outcomes line says so.
Everything is restored on both kernels at the end; the agent on the VM is started again.

    .venv/bin/python bench/bench_profile_vm.py [--switches 12] [--no-up] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.vm.region import Region  # noqa: E402

# A TOML literal string: the regex reaches the profile as written here (one backslash before the dot).
IRQ = "nic = { match = '" + r"virtio[0-9]+-(input|output)(\.[0-9]+)?$|eth[0-9]+-(rx|tx|TxRx)-[0-9]+" + "', cpus = \"%s\" }"
PROFILES = {
    "switch-a": '[sysctl]\n"vm.swappiness" = 11\n"net.core.somaxconn" = 1111\n"net.core.netdev_max_backlog" = 1500\n'
                '"vm.dirty_ratio" = 21\n[cgroup_cpu]\nenabled = true\n[irqbalance]\nrunning = false\n'
                f'[irq_affinity]\n{IRQ % "0"}\n',
    "switch-b": '[sysctl]\n"vm.swappiness" = 22\n"net.core.somaxconn" = 2222\n"net.core.netdev_max_backlog" = 2500\n'
                '"vm.dirty_ratio" = 31\n[cgroup_cpu]\nenabled = false\n[irqbalance]\nrunning = false\n'
                f'[irq_affinity]\n{IRQ % "1"}\n',
    "huge-a": '[hugepages]\n"2M" = 16\n',
    "huge-b": '[hugepages]\n"2M" = 48\n',
}
SERIES = ["sysctl+irq+cgroup-cpu:switch-a:switch-b", "hugepages-2M:huge-a:huge-b"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def parse(out: str) -> dict[str, dict]:
    results = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if "error" in r:
                raise SystemExit(f"{r['series']}: {r['error']}")
            results[r["series"]] = r
    return results


def on_host(switches: int) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        for name, body in PROFILES.items():
            Path(tmp, f"{name}.toml").write_text(body)
        cmd = [sys.executable, str(REPO / "bench/profile_switch_probe.py"), "--dir", tmp, "--state", f"{tmp}/state",
               "--switches", str(switches), *[a for s in SERIES for a in ("--series", s)]]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        if r.returncode:
            raise SystemExit(f"host probe failed: {r.stdout}{r.stderr}")
        return parse(r.stdout)


def on_vm(region: Region, vm: str, switches: int) -> dict[str, dict]:
    files = "".join(f"cat > /tmp/bench-profiles/{n}.toml <<'EOF'\n{b}EOF\n" for n, b in PROFILES.items())
    probe = (REPO / "bench/profile_switch_probe.py").read_text()
    region.ssh(vm, f"rm -rf /tmp/bench-profiles && mkdir -p /tmp/bench-profiles\n{files}"
                   f"cat > /tmp/bench-profiles/probe.py <<'EOF'\n{probe}EOF\n")
    region.ssh(vm, "systemctl stop twine-agent")
    try:
        series = " ".join(f"--series {s}" for s in SERIES)
        out = region.ssh(vm, f"/opt/twine/venv/bin/python /tmp/bench-profiles/probe.py --dir /tmp/bench-profiles "
                             f"--state /tmp/bench-profiles/state --switches {switches} {series}", timeout=1800)
        return parse(out)
    finally:
        region.ssh(vm, "systemctl start twine-agent; rm -rf /tmp/bench-profiles", check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switches", type=int, default=12)
    ap.add_argument("--no-up", action="store_true", help="use the region that is up (vagrant/.region)")
    ap.add_argument("--keep", action="store_true", help="leave the region up")
    args = ap.parse_args()
    region = Region(machines=1, spare=False)
    if not args.no_up:
        t0 = time.monotonic()
        region.up()
        print(f"region up (control + m1) in {time.monotonic() - t0:.0f} s", flush=True)
    try:
        vm = on_vm(region, "m1", args.switches)
        host = on_host(args.switches)
    finally:
        if not args.no_up and not args.keep:
            region.down()
    print(f"\nprofile switch time, engine-measured (read, journal, write, verify, per switch), {args.switches} "
          "switches per series; ratio = VM / host")
    print(f"{'series':24} {'VM p50':>9} {'VM p90':>9} {'host p50':>9} {'host p90':>9} {'p50 ratio':>9}")
    for s in SERIES:
        name = s.split(":")[0]
        v, h = vm[name]["seconds"], host[name]["seconds"]
        print(f"{name:24} {pct(v, .5) * 1000:7.1f}ms {pct(v, .9) * 1000:7.1f}ms {pct(h, .5) * 1000:7.1f}ms "
              f"{pct(h, .9) * 1000:7.1f}ms {pct(v, .5) / pct(h, .5):8.1f}x")
    for where, res in (("VM", vm), ("host", host)):
        for s in SERIES:
            name = s.split(":")[0]
            outcomes = ", ".join(f"{k.split(':')[0]}:{k.split(':', 1)[1]} {'/'.join(v)}" for k, v in res[name]["outcomes"].items())
            print(f"  {where} {name}: {outcomes}")
    print(f"  (mean VM {statistics.mean(vm[SERIES[0].split(':')[0]]['seconds']) * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
