"""End-to-end job creation through the REST API, against real etcd, with 10,000 registered machines.

What is measured: `POST /v1/jobs` (10 tasks each) from C concurrent HTTP clients to a real
`twine-controld` process on a real etcd (both on this machine), for S seconds; a job counts when
its 201 arrives, i.e. after the placement is committed to etcd and the daemon's watch has seen it
(read-your-writes). Reported: jobs/s, tasks/s, latency p50/p90/p99.

The machines are registered through the API (`POST /v1/agent/register`, as agents do); none
heartbeats (the heartbeat timeout is set long), so nothing but job creation loads the daemon.
Machines: 10,000 in 2 DCs x 10 MSBs x 50 racks, 16 cpus / 64 GB each; 20 entitlements (quota
500 each); tasks of 0.1 cpu / 64 MB, spread over dc and msb.

Baseline, measured in the same run: the same number of etcd transactions of the same shape
(one transaction writing 1 job key + 10 task keys + 10 discovery keys, guarded by the job's and
10 machine keys' mod revisions: a placement guards the machines it places on and writes one only
when it changes hands, which the baseline leaves out), sent by the same number of concurrent
clients straight to etcd with the aetcd client: the floor that the commit alone costs. The ratio
says how much of the API path is not etcd.

    .venv/bin/python bench/bench_api_create.py [--machines 10000] [--seconds 20] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.store.etcdproc import EtcdServer  # noqa: E402
from controlplane.store import Store, Versioned  # noqa: E402
from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN, Controld  # noqa: E402

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.1, "memory_mb": 64}


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


async def register_all(url: str, region: str, n: int) -> float:
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(32)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}) as http:
        async def one(i: int) -> None:
            body = {"machine_id": f"m{i:07d}", "hostname": f"m{i}", "address": "",
                    "labels": {"region": region, "dc": f"dc{i % 2}", "msb": f"msb{i % 20}", "rack": f"rack{i % 1000}",
                               "machine_type": "generic"},
                    "capacity": {"cpus": 16, "memory_mb": 65536}}
            async with sem, http.post(url + "/v1/agent/register", json=body) as r:
                assert r.status == 200, await r.text()

        await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0


async def create_jobs(url: str, seconds: float, clients: int, ents: int) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_TOKEN}"}) as http:
        async def client(c: int) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                i = next(counter)
                spec = {"entitlement": f"e{i % ents}", "name": f"j{i}", "count": 10, "task": TASK}
                t0 = time.perf_counter()
                async with http.post(url + "/v1/jobs", json=spec) as r:
                    await r.read()
                    if r.status == 201:
                        lat.append(time.perf_counter() - t0)
                    else:
                        errors += 1
                        if errors <= 3:
                            print(f"  job {i}: HTTP {r.status} {(await r.text())[:200]}")

        await asyncio.gather(*(client(c) for c in range(clients)))
    return lat, errors


async def etcd_baseline(port: int, seconds: float, clients: int) -> list[float]:
    store = Store([("127.0.0.1", port)])
    lat: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))
    try:
        async def client(c: int) -> None:
            while time.perf_counter() < deadline:
                i = next(counter)
                job = f"/bench/jobs/b{i}"
                machines = [f"/bench/machines/m{(i * 10 + k) % 10000}" for k in range(10)]
                reads = [Versioned(job, None, 0)] + [Versioned(m, None, 0) for m in machines]
                puts = {job: {"count": 10, "task": TASK}}
                puts.update({f"/bench/tasks/b{i}/{k:06d}": {"machine": machines[k], "task": TASK} for k in range(10)})
                puts.update({f"/bench/discovery/b{i}/{k:06d}": {"machine": machines[k]} for k in range(10)})
                t0 = time.perf_counter()
                await store.commit(reads, puts)  # (nothing writes the machines: no race to lose)
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(client(c) for c in range(clients)))
    finally:
        await store.close()
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--entitlements", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    etcd = EtcdServer(data_dir=tmp / "etcd").start()
    c = Controld(tmp, etcd.port, heartbeat_timeout=100_000, region="bench", extra=("--log-level", "warning"))
    try:
        c.start()
        reg = asyncio.run(register_all(c.url, c.region, args.machines))
        print(f"registered {args.machines} machines through the API in {reg:.1f}s ({args.machines / reg:.0f}/s)")
        for e in range(args.entitlements):
            status, body = c.call("POST", "/v1/entitlements", {"name": f"e{e}", "machine_type": "generic",
                                                             "quota": args.machines // args.entitlements})
            assert status == 201, body
        lat, errors = asyncio.run(create_jobs(c.url, args.seconds, args.clients, args.entitlements))
        conflicts = int(c.metric("twine_scheduler_conflicts_total"))
        base = asyncio.run(etcd_baseline(etcd.port, args.seconds / 2, args.clients))
    finally:
        c.close()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(lat)
    rate = n / args.seconds
    brate = len(base) / (args.seconds / 2)
    print(f"\nPOST /v1/jobs (10 tasks each), {args.clients} clients, {args.seconds:.0f}s, {args.machines} machines, "
          f"real etcd:")
    print(f"  API:      {rate:7.1f} jobs/s ({rate * 10:.0f} tasks/s), latency p50 {pct(lat, 50) * 1000:.1f} ms, "
          f"p90 {pct(lat, 90) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms; {errors} not 201; {conflicts} placement(s) retried after a conflict")
    print(f"  baseline: {brate:7.1f} transactions/s straight to etcd (the same shape, {args.clients} clients), "
          f"p50 {pct(base, 50) * 1000:.1f} ms, p99 {pct(base, 99) * 1000:.1f} ms")
    print(f"  ratio API/etcd-alone: {rate / brate:.2f} of the throughput; goal >= 200 jobs/s with p99 < 250 ms: "
          f"{'met' if rate >= 200 and pct(lat, 99) < 0.25 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
