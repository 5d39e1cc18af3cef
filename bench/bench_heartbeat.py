"""What one agent heartbeat costs twine-controld, against a request with no body and no auth.

A real etcd and a real twine-controld; N machines register and send one full task report, then
steady-state heartbeats (digest unchanged, no task list) are sent over keep-alive connections.
Baseline, in the same run and the same way: GET /healthz (no auth, no body; not the cheapest
request: it asks etcd for a linearizable read each call, as its answer must never lag an outage,
and cost more controld CPU than a heartbeat in two runs of 2026-12-07 beside a test run: 197-207
against 112-117 us). Prints both rates, their ratio, controld's CPU time per heartbeat (what
100,000 agents at one heartbeat a second would need) and how many etcd writes the steady
heartbeats caused (the design says none).

A third round sends the same steady heartbeats with usage (issue #25): the host's figures and 20
tasks' (of a job the region has, so that each counts in the sums), as agents send with every
heartbeat; the last line is its cost against the heartbeats without (the issue asks <= 1.3).

    .venv/bin/python bench/bench_heartbeat.py [--machines 2000] [--beats 20000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.store.etcdproc import EtcdServer  # noqa: E402
from controlplane.store import Store  # noqa: E402
from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN, Controld  # noqa: E402


async def etcd_revision(port: int) -> int:
    store = Store([("127.0.0.1", port)])
    try:
        return (await store.range("/twine/"))[1]
    finally:
        await store.close()


async def run(args: argparse.Namespace, c: Controld, etcd_port: int) -> None:
    conn = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(c.url, connector=conn) as http:
        creds: list[tuple[str, str]] = []

        async def register(i: int) -> None:
            mid = f"bench-{i:06d}"
            body = {"machine_id": mid, "labels": {"region": c.region, "dc": f"dc{i % 2}", "msb": f"msb{i % 6}",
                                                  "rack": f"rack{i % 60}", "machine_type": "generic"},
                    "capacity": {"cpus": 32, "memory_mb": 131072}}
            async with http.post("/v1/agent/register", json=body,
                                 headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}) as r:
                creds.append((mid, (await r.json())["credential"]))

        await gather_bounded([register(i) for i in range(args.machines)], args.concurrency)
        report = [{"job": "bench/svc", "index": 0, "spec_version": 1, "state": "running", "restarts": 1}]

        async def beat(mid: str, cred: str, full: bool) -> None:
            body = {"machine_id": mid, "seq": 1, "desired_version": "v", "digest": "d1",
                    "health": {"ok": True, "problems": []}, "profile": {"name": None, "ok": True, "error": ""}}
            if full:
                body["tasks"] = report
            async with http.post("/v1/agent/heartbeat", json=body, headers={"Authorization": f"Bearer {cred}"}) as r:
                assert r.status == 200, await r.text()
                await r.read()

        await gather_bounded([beat(m, cr, True) for m, cr in creds], args.concurrency)
        admin = {"Authorization": f"Bearer {API_TOKEN}"}
        async with http.post("/v1/entitlements", json={"name": "bench", "machine_type": "generic", "quota": 1},
                             headers=admin) as r:
            assert r.status == 201, await r.text()
        async with http.post("/v1/jobs", json={"entitlement": "bench", "name": "svc", "count": 20, "task": {
                "image": "twine/busybox:1", "command": ["sleep", "1"], "cpus": 0.1, "memory_mb": 64}},
                headers=admin) as r:
            assert r.status == 201, await r.text()
        usage = {"window": 1.0, "cpus": 32, "cpu": 3.2, "memory_mb": 20480.0, "memory_total_mb": 131072.0,
                 "power_w": 180.5, "tasks": [["bench/svc", i, 0.137 + i / 100, 90.5 + i] for i in range(20)]}

        async def beat_usage(mid: str, cred: str) -> None:
            body = {"machine_id": mid, "seq": 1, "desired_version": "v", "digest": "d1",
                    "health": {"ok": True, "problems": []}, "profile": {"name": None, "ok": True, "error": ""},
                    "usage": usage}
            async with http.post("/v1/agent/heartbeat", json=body, headers={"Authorization": f"Bearer {cred}"}) as r:
                assert r.status == 200, await r.text()
                await r.read()

        async def healthz(_: int) -> None:
            async with http.get("/healthz") as r:
                await r.read()

        proc = psutil.Process(c.proc.pid)
        rounds = {}
        for name, make in (("healthz", lambda i: healthz(i)),
                           ("heartbeat", lambda i: beat(*creds[i % len(creds)], False)),
                           ("usage", lambda i: beat_usage(*creds[i % len(creds)]))):
            await gather_bounded([make(i) for i in range(min(2000, args.beats))], args.concurrency)  # warm up
            rev0 = await etcd_revision(etcd_port)
            cpu0 = sum(proc.cpu_times()[:2])
            t0 = time.perf_counter()
            await gather_bounded([make(i) for i in range(args.beats)], args.concurrency)
            seconds = time.perf_counter() - t0
            cpu = sum(proc.cpu_times()[:2]) - cpu0
            rounds[name] = (args.beats / seconds, cpu / args.beats, await etcd_revision(etcd_port) - rev0)

    hz, hz_cpu, _ = rounds["healthz"]
    hb, hb_cpu, writes = rounds["heartbeat"]
    hu, hu_cpu, writes_u = rounds["usage"]
    print(f"{args.machines} machines registered; {args.beats} requests each round, concurrency {args.concurrency}")
    print(f"baseline GET /healthz:     {hz:8.0f} req/s   controld cpu {hz_cpu * 1e6:6.0f} us/req")
    print(f"heartbeat (digest same):   {hb:8.0f} req/s   controld cpu {hb_cpu * 1e6:6.0f} us/req")
    print(f"heartbeat / baseline:      {hb / hz:8.2f} x throughput, {hb_cpu / hz_cpu:.2f} x cpu per request")
    print(f"etcd writes caused by {args.beats} steady heartbeats: {writes}")
    print(f"100,000 agents at 1 heartbeat/s: {100_000 * hb_cpu:.1f} cores of controld (one Python process "
          f"serves {1 / hb_cpu:,.0f}/s)")
    print(f"heartbeat with usage of 20 tasks: {hu:8.0f} req/s   controld cpu {hu_cpu * 1e6:6.0f} us/req   "
          f"etcd writes {writes_u}")
    print(f"heartbeat with usage / without: {hb / hu:.2f} x the time per heartbeat (the answered rates' ratio, "
          f"{args.concurrency} at once), {hu_cpu / hb_cpu:.2f} x controld cpu per heartbeat")


async def gather_bounded(coros: list, limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machines", type=int, default=2000)
    p.add_argument("--beats", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()
    etcd = EtcdServer().start()
    with tempfile.TemporaryDirectory() as tmp:
        c = Controld(Path(tmp), etcd.port, heartbeat_timeout=600).start()
        try:
            asyncio.run(run(args, c, etcd.port))
        finally:
            c.close()
            etcd.stop()


if __name__ == "__main__":
    main()
