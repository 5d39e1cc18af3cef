"""A large simulated region split over shards and several twine-controld processes on this machine.

Simulated, and named so: no agent runs a container. Machine records are bulk-loaded straight into
etcd (not registered through the API, which at ~400 registrations/s here would take most of an
hour at 1M), each with a known credential, so that simulated agents can heartbeat as real agents
do (following the `heartbeat_to` the answers name). Everything else is the real path: real etcd,
real `twine-controld` processes with `--shard-count` and `--shards`, jobs created through the API.
controld runs as install-controld.sh sets it up: `--max-txn-ops 65536` beside an etcd that takes
as much (this bench's etcd does), so the creates that wait together go in one transaction (the
health check's failures stay at FAIL_BATCH machines a transaction). `--max-txn-ops 128` runs it at
controld's own default, etcd's: each 36-task job is then a round trip of its own.

Measured, each beside a baseline taken in the same run:
  1. index time: from the processes' start until every one answers and every shard has a leader;
     baseline: one paged range read of the same records in this process (the etcd read alone);
  2. memory: resident set of each process (psutil), and their sum;
  3. heartbeats: A simulated agents (machines 0..A-1) every I seconds from the
     moment the processes are ready, sent as agents send them (each to the replica its last answer
     named) over a few pipelined keep-alive connections to each replica (raw asyncio streams: the
     load generator shares the machine's cores with the daemons and must cost little); heartbeats
     answered per second (over the seconds they were sent: S alone, then through 4. and 5.; and in
     each of these phases) against the target A/I (below it: the replicas did not keep up: an
     agent whose last heartbeat is unanswered when the next is due sends none; a heartbeat waits
     for its answer at the replica it went to, and holds no other), how long answers took, and
     failure verdicts on those machines (false ones: goal 0). Machines beyond A never heartbeat:
     they are loaded as failed already (as the health check would leave them);
  4. allocation: jobs of 36 tasks created through the API for S seconds (the heartbeats' second
     S: they go on meanwhile), spread over entitlements
     in every shard (8 clients, each request to any process: forwarded to the shard's leader);
     jobs/s per shard. The 8 clients wait for each answer before the next request, so with many
     shards this is bounded by their round trips: what the region answered them, not what a
     shard can sustain;
  5. one shard's capacity: jobs of 36 tasks created in shard 0 only, for S seconds after 4. (the
     heartbeats go on), by 32 closed-loop clients at the shard's leader (the process shares the
     machine's two cores with the others and etcd); baseline: the same clients reading jobs of that
     shard from its leader (GET /v1/jobs/{ent}/{name}) for S/2 seconds;
  6. the fleet: GET /v1/fleet?by=dc,msb,entitlement 20 times, one after another, during the
     heartbeats (after 7.'s scrapes); p50; baseline: GET /v1/cluster, which names no machine;
  7. Prometheus scrapes: every process's /v1/metrics, one after another, for S/2 seconds of 3.;
     the longest event loop stall of each process in those seconds, from its stall monitor
     (twine_event_loop_lag_recent_seconds, the longest lag of its last 10 s); baseline: the same
     figure for the S/2 seconds before, heartbeats alone (the monitor's window is 10 s: with S/2 under
     10 s, as in the tests' small run, the two windows overlap and the figures say less).

Its last line: `region 1M: rss R GiB; heartbeats H/s; one shard J jobs/s; fleet F ms; scrape stall S
ms; false verdicts V` (R: the processes' resident memory together, at the start or the end,
whichever is more; H: heartbeats per second of those due in 3. before any job is created (scrapes
and fleet requests included), answered 200 within the interval, over those seconds: A/I when every
heartbeat due was answered in time, less for each one not sent (its agent's last unanswered), refused
or late (until issue #38's sixth turn, answers counted as they arrived in that window, which opens
with the first heartbeat: those still in flight at its end were missed, so it stayed under A/I
however fast the region answered); J: 5.; F: 6.'s p50; S: 7.'s longest; V: 3.'s false failure
verdicts).

    .venv/bin/python bench/bench_region_scale.py [--machines 1000000] [--processes 4] [--shards 20]
        [--agents 100000] [--interval 10] [--seconds 20] [--max-txn-ops 65536]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections import deque
from pathlib import Path

import aiohttp
import msgspec
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.store.etcdproc import EtcdServer  # noqa: E402
from controlplane.store.digest import Digest  # noqa: E402
from controlplane.store.records import EntitlementRec, MachineRec  # noqa: E402
from controlplane.store import Store  # noqa: E402
from controlplane.store.keys import Keys  # noqa: E402
from controlplane.usage import history as H  # noqa: E402
from tests.controlplane.controld_proc import API_TOKEN, Controld  # noqa: E402

REGION = "scale"
PER_RACK, RACKS_PER_MSB = 40, 50  # racks of 40 machines, MSBs of 2,000, the MSBs dealt over 3 DCs
TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.5, "memory_mb": 512}


def cred(mid: str) -> str:
    return f"cred-{mid}"


def machine(i: int, agents: int) -> MachineRec:
    """Machines 0..agents-1 heartbeat (simulated agents) and are loaded healthy; the rest never
    heartbeat and are loaded as already failed, as the health check would leave them: their
    verdicts are the starting state, not a storm of failure writes during the measurement."""
    mid = f"m{i:07d}"
    rack = i // PER_RACK
    msb = rack // RACKS_PER_MSB
    return MachineRec(id=mid, hostname=mid, labels={"region": REGION, "dc": f"dc{msb % 3}", "msb": f"msb{msb:04d}",
                                                     "rack": f"rack{rack:06d}", "machine_type": ("t1", "t2", "t3")[rack % 3]},
                      capacity={"cpus": 32, "memory_mb": 131072},
                      credential_sha256=Digest.of(cred(mid)), registered_at=time.time(),
                      healthy=i < agents, health_reason="" if i < agents else "no heartbeat (never: no simulated agent)")


async def bulk_load(port: int, n: int, shards: int, ents_per_shard: int, agents: int) -> float:
    keys = Keys(REGION)
    store = Store([("127.0.0.1", port)])
    t0 = time.perf_counter()
    try:
        for base in range(0, n, 5000):
            await store.commit([], {keys.machine(m.id): m.to_json()
                                    for m in (machine(i, agents) for i in range(base, min(n, base + 5000)))})
        await store.commit([], {keys.settings(): {"shards": shards}})
        ents = {}
        for s in range(shards):
            for e in range(ents_per_shard):
                rec = EntitlementRec(name=f"s{s}-e{e}", machine_type=("t1", "t2", "t3")[e % 3], quota=n // 10,
                                     shard=s, created_at=time.time())
                ents[keys.entitlement(rec.name)] = rec.to_json()
        await store.commit([], ents)
    finally:
        await store.close()
    return time.perf_counter() - t0


async def range_baseline(port: int) -> tuple[float, int]:
    store = Store([("127.0.0.1", port)])
    try:
        t0 = time.perf_counter()
        items, _ = await store.range(Keys(REGION).machines())
        return time.perf_counter() - t0, len(items)
    finally:
        await store.close()


def wait_ready(cs: list[Controld], shards: int, timeout: float) -> float:
    """Seconds until every process answers and sees every shard led."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    pending = list(cs)
    while pending and time.monotonic() < deadline:
        for c in list(pending):
            try:
                if c.proc.poll() is not None:
                    raise SystemExit(f"controld exited {c.proc.returncode}: {c.log.read_text()[-2000:]}")
                shards_seen = c.cluster().get("shards", [])
                if len(shards_seen) == shards and all(s["leader"] for s in shards_seen):
                    pending.remove(c)
            except OSError:  # not listening yet: still reading the region
                pass
        time.sleep(0.5)
    if pending:
        raise SystemExit(f"not ready in {timeout:.0f}s: {[c.url for c in pending]}")
    return time.perf_counter() - t0


async def create_jobs(urls: list[str], ents: list[str], seconds: float, clients: int = 8,
                      prefix: str = "j", created: list[str] | None = None) -> tuple[int, dict]:
    done: dict[str, int] = {}
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_TOKEN}"},
                                     connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def client(c: int) -> None:
            while time.perf_counter() < deadline:
                i = next(counter)
                ent = ents[i % len(ents)]
                async with http.post(urls[i % len(urls)] + "/v1/jobs", json={
                        "entitlement": ent, "name": f"{prefix}{i}", "count": 36, "task": TASK}) as r:
                    await r.read()
                    if r.status == 201:
                        done[ent] = done.get(ent, 0) + 1
                        if created is not None:
                            created.append(f"{ent}/{prefix}{i}")

        await asyncio.gather(*(client(c) for c in range(clients)))
    return sum(done.values()), done


async def read_jobs(url: str, handles: list[str], seconds: float, clients: int) -> int:
    """GET /v1/jobs/{ent}/{name} of these jobs, as many as the clients get answered: the front
    end's round trip to a shard's leader without an allocation or a commit."""
    done = 0
    if not handles:
        return 0
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_TOKEN}"},
                                     connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def client(c: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with http.get(f"{url}/v1/jobs/{handles[next(counter) % len(handles)]}") as r:
                    await r.read()
                    done += r.status == 200

        await asyncio.gather(*(client(c) for c in range(clients)))
    return done


class _Pipe:
    """One keep-alive connection to a replica carrying pipelined heartbeats (HTTP/1.1: answers come
    in order): little work a request on the simulated agents' side, so that on a machine of two
    cores the daemons get the CPU, not the load generator. (With aiohttp's client, a task a
    heartbeat, the generator fell behind 10,000/s on two cores with 4 daemons and etcd.)

    A heartbeat is written as soon as it is due, whatever is in flight: it waits for its answer in
    the replica's socket (or behind it in this connection's buffer), as an agent's request waits
    in the backlog of a replica slow to answer; each agent has one out at a time (heartbeats()).
    Until issue #38's fourth turn a pipe took 64 at most and the generator waited for room, so one
    slow replica held every agent's heartbeats, to every replica: their machines, silent for it,
    were failed, and counted as false verdicts of the replicas'."""

    def __init__(self, url: str):
        self.url = url
        self.host, _, port = url.removeprefix("http://").partition(":")
        self.port = int(port)
        self.waiting: deque[tuple[str, float, float]] = deque()  # (machine, when sent, when due) of each request in flight, oldest first
        self.ok = self.failed = 0
        self.closed = 0  # connections the replica closed (each opened again)
        self.waits = array("d")  # seconds each answered heartbeat waited for its answer
        self.ok_sent = array("d")  # when each heartbeat answered 200 was due, and how long its answer
        self.ok_wait = array("d")  # took (H: those due in phase 3.'s seconds, answered in time)
        self.ready = asyncio.Event()  # clear while the pipe opens a new connection
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.ready.set()

    def send(self, mid: str, body: bytes, due: float) -> bool:
        """Written now (`due`: when it was due); False while the connection opens again (the agent
        tries another)."""
        if not self.ready.is_set():
            return False
        self.waiting.append((mid, time.perf_counter(), due))
        self.writer.write(b"POST /v1/agent/heartbeat HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                          % (self.host.encode(), cred(mid).encode(), len(body), body))
        return True

    async def answers(self, hint: dict[str, str], first: dict[str, float], out: set[str]) -> None:
        """Answers in order; `out` (the machines with a heartbeat unanswered) loses each answered."""
        while True:
            try:
                head = await self.reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                answer = await self.reader.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError):
                # the replica closed the connection (a connection limit, a timeout under load): what
                # was in flight on it failed (its agents send again when next due), and the pipe
                # goes on over a new connection
                self.ready.clear()
                self.failed += len(self.waiting)
                out.difference_update(mid for mid, _, _ in self.waiting)
                self.waiting.clear()
                self.writer.close()
                self.closed += 1
                while True:  # a replica that refuses connections for a moment holds this pipe, not the bench
                    try:
                        await self.open()
                        break
                    except OSError:
                        await asyncio.sleep(0.5)
                continue
            mid, sent, due = self.waiting.popleft()
            out.discard(mid)
            self.waits.append(time.perf_counter() - sent)
            if status == 200:
                self.ok += 1
                self.ok_sent.append(due)
                self.ok_wait.append(self.waits[-1])
                first.setdefault(mid, time.time())
                if b"heartbeat_to" in answer:
                    hint[mid] = msgspec.json.decode(answer)["heartbeat_to"]
            else:
                self.failed += 1


async def heartbeats(urls: list[str], agents: int, interval: float, stop: asyncio.Event,
                     every: list[_Pipe]) -> tuple[int, int, float, int, int]:
    """Each simulated agent heartbeats every `interval` s (phases spread), to the replica its last
    answer named (heartbeat_to), else a random one, over a few pipelined keep-alive connections to
    each replica (put in `every`), until `stop` is set; an agent whose last heartbeat is still
    unanswered when the next is due waits for it (that one is not sent). Returns (answered, failed or
    not sent for want of a connection, seconds sent for, connections a replica closed, heartbeats
    not sent: the last one unanswered)."""
    hint: dict[str, str] = {}
    first = FIRST_OK
    rate = agents / interval
    pipes = {url: [_Pipe(url) for _ in range(4)] for url in urls}
    every += [p for ps in pipes.values() for p in ps]
    await asyncio.gather(*(p.open() for p in every))
    out: set[str] = set()  # machines whose last heartbeat is unanswered
    readers = [asyncio.create_task(p.answers(hint, first, out)) for p in every]
    t0 = BEGAN[0] = time.perf_counter()
    n = waited = unsent = 0
    try:
        while not stop.is_set():
            due = int((time.perf_counter() - t0) * rate)
            while n < due:
                i = n % agents
                n += 1
                mid = f"m{i:07d}"
                if mid in out:
                    waited += 1
                    continue
                body = (b'{"machine_id":"%s","digest":"d0","tasks":[],"profile":{"name":null,"ok":true}%s}'
                        % (mid.encode(), USAGE))
                to = pipes.get(hint.get(mid)) or pipes[random.choice(urls)]
                due_at = t0 + (n - 1) / rate
                if random.choice(to).send(mid, body, due_at) or any(p.send(mid, body, due_at) for p in to):
                    out.add(mid)
                else:  # every connection to that replica opening again: not sent, counted as refused
                    unsent += 1
            await asyncio.sleep(0.01)
        sent_for = time.perf_counter() - t0
        deadline = time.perf_counter() + 30
        while any(p.waiting for p in every) and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
    finally:
        for r in readers:
            r.cancel()
        for p in every:
            p.writer.close()
    return (sum(p.ok for p in every), sum(p.failed for p in every) + sum(len(p.waiting) for p in every) + unsent,
            sent_for, sum(p.closed for p in every), waited)


FIRST_OK: dict[str, float] = {}  # machine -> wall time of its first heartbeat answered
BEGAN = [0.0]  # when heartbeats() began sending (perf_counter)


def in_time(pipes, start: float, end: float, interval: float) -> float:
    """Heartbeats per second due in [start, end) that were answered 200 within `interval` (before
    the agent's next was due): `rate` due a second, all answered in time, gives `rate`."""
    n = sum(1 for p in pipes for due, wait in zip(p.ok_sent, p.ok_wait) if start <= due < end and wait <= interval)
    return n / (end - start)


# usage as agents send it with every heartbeat (issue #25): the host's and 20 tasks' figures, of
# jobs of the region's first entitlement (counted in its sums once those jobs exist); --no-usage: none
USAGE = b',"usage":' + msgspec.json.encode({
    "window": 10.0, "cpus": 32, "cpu": 7.25, "memory_mb": 40960.0, "memory_total_mb": 131072.0, "power_w": None,
    "tasks": [[f"s0-e0/j{i % 4}", i, 0.31 + i / 100, 512.0 + i] for i in range(20)]})
CAPACITY_CLIENTS = 32
RECENT_LAG = "twine_event_loop_lag_recent_seconds"  # the stall monitor's longest lag of the last 10 s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=1_000_000)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--agents", type=int, default=100_000)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--no-usage", action="store_true", help="heartbeats without usage (as before issue #25)")
    ap.add_argument("--max-txn-ops", type=int, default=65536,
                    help="controld's --max-txn-ops: 65536 (the default here) as install-controld.sh sets it beside an "
                         "etcd with the same limit (this bench's etcd has it); 128, controld's own default, puts each "
                         "36-task job in a transaction of its own")
    args = ap.parse_args()
    global USAGE
    if args.no_usage:
        USAGE = b""
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    etcd = EtcdServer(data_dir=tmp / "etcd", extra_flags=("--quota-backend-bytes", str(8 * 1024**3))).start()
    cs: list[Controld] = []
    try:
        load = asyncio.run(bulk_load(etcd.port, args.machines, args.shards, 3, args.agents))
        racks = -(-args.machines // PER_RACK)
        print(f"bulk-loaded {args.machines:,} machine records (3 DCs, {-(-racks // RACKS_PER_MSB):,} MSBs, {racks:,} racks "
              f"of {PER_RACK}, 3 machine types by rack) and "
              f"{args.shards * 3} entitlements into etcd in {load:.1f}s")
        base_read, n = asyncio.run(range_baseline(etcd.port))
        per = -(-args.shards // args.processes)
        for p in range(args.processes):
            (tmp / f"p{p}").mkdir()
            shards = f"{p * per}-{min(args.shards, (p + 1) * per) - 1}"
            cs.append(Controld(tmp / f"p{p}", etcd.port, heartbeat_timeout=30, region=REGION, extra=(
                "--heartbeat-interval", "10", "--shard-count", str(args.shards), "--shards", shards,
                "--max-txn-ops", str(args.max_txn_ops), "--log-level", "warning")).launch())
        ready = wait_ready(cs, args.shards, 1800)
        urls = [c.url for c in cs]
        rss = [psutil.Process(c.proc.pid).memory_info().rss / 2**30 for c in cs]
        print(f"\n1. index: {args.processes} processes x {args.shards} shards ready (every shard led) {ready:.1f}s after "
              f"start; baseline: one paged range read of the {n:,} records {base_read:.1f}s (ratio {ready / base_read:.1f})")
        print(f"2. memory: {', '.join(f'{r:.2f}' for r in rss)} GiB per process; {sum(rss):.2f} GiB together "
              f"(goal: all processes <= 3.0 GiB together: {'met' if sum(rss) <= 3.0 else 'NOT met'})")
        # heartbeats first: the health check judges a machine silent for its grace (timeout + 5 s)
        # after the process started, so the simulated agents must begin at once
        ents = [f"s{s}-e{e}" for s in range(args.shards) for e in range(3)]

        async def both():
            # heartbeats alone for S, then on while jobs are created over every shard for S, then in
            # one shard for S, then that shard's jobs are read for S/2 (4. and 5.)
            stop = asyncio.Event()
            beating = asyncio.create_task(heartbeats(urls, args.agents, args.interval, stop, pipes))

            def mark(phase: str) -> None:  # answers so far, to give each phase's rate; memory then
                marks.append((phase, time.perf_counter(), sum(p.ok for p in pipes)))
                rss_at[phase] = sum(psutil.Process(c.proc.pid).memory_info().rss for c in cs) / 2**30

            mark("start")
            # the first half alone; then the longest loop stall of each process in the last 10 s
            # (its stall monitor), the baseline; then Prometheus scrapes of every process, one
            # after another, for the second half, and the longest stall again; then the fleet
            await asyncio.sleep(args.seconds / 2)
            quiet.extend(await asyncio.to_thread(lambda: [c.metric(RECENT_LAG) for c in cs]))
            until = time.monotonic() + args.seconds / 2
            while time.monotonic() < until:
                for c in cs:
                    await asyncio.to_thread(c.metrics)
                    scrapes.append(c.url)
                await asyncio.sleep(0.25)
            scraped.extend(await asyncio.to_thread(lambda: [c.metric(RECENT_LAG) for c in cs]))
            for path, out in (("/v1/fleet?by=dc,msb,entitlement", fleet_ms), ("/v1/cluster", cluster_ms)):
                for _ in range(20):
                    t0 = time.perf_counter()
                    status, _ = await asyncio.to_thread(cs[0].call, "GET", path)
                    out.append((time.perf_counter() - t0) * 1000)
                    if status != 200:
                        raise SystemExit(f"GET {path}: {status}")
            mark("alone")
            created = await create_jobs(urls, ents, args.seconds)
            mark("during 4.")
            deadline = time.monotonic() + 30
            while True:  # shard 0's leader (none for a moment if its leadership just moved)
                shard0 = next(s for s in (await asyncio.to_thread(cs[0].cluster))["shards"] if s["shard"] == 0)
                if shard0["leader_url"] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            if not shard0["leader_url"]:
                raise SystemExit("shard 0 has had no leader for 30 s")
            leader, mine, handles = shard0["leader_url"], shard0["entitlements"], []
            made, _ = await create_jobs([leader], mine, args.seconds, CAPACITY_CLIENTS, prefix="cap", created=handles)
            reads = await read_jobs(leader, handles[:100], args.seconds / 2, CAPACITY_CLIENTS)
            mark("during 5.")
            stop.set()
            return await beating, created, (made, reads)

        marks: list[tuple[str, float, int]] = []
        pipes: list[_Pipe] = []  # the heartbeats' connections
        rss_at: dict[str, float] = {}  # the processes' memory together (GiB) at the end of each phase
        quiet: list[float] = []  # each process's longest loop stall of the 10 s before the scrapes
        scraped: list[float] = []  # and of the 10 s of scrapes
        scrapes: list[str] = []
        fleet_ms: list[float] = []
        cluster_ms: list[float] = []
        (ok, failed, beat_for, closed, waited), (total, per_ent), (made, reads) = asyncio.run(both())
        rss_end = [psutil.Process(c.proc.pid).memory_info().rss / 2**30 for c in cs]
        phases = ", ".join(f"{b[0]} {(b[2] - a[2]) / (b[1] - a[1]):.0f}/s" for a, b in zip(marks, marks[1:]))
        time.sleep(1)
        events = cs[0].call("GET", "/v1/events")[1]["events"]
        # false: a machine declared failed after it had heartbeated (and kept heartbeating every
        # interval); one judged before its first heartbeat reached anyone was silent, truly
        false = [e for e in events if e["kind"] == "failure"
                 and any(m in FIRST_OK and e["start"] > FIRST_OK[m] for m in e["machines"])]
        relays = sum(c.metric("twine_relay_seen_relayed_total") for c in cs)
        lost = [int(c.metric("twine_coordination_lease_failures_total")) for c in cs]
        deposed = [int(c.metric("twine_coordination_depositions_total")) for c in cs]
        print(f"3. heartbeats: {args.agents:,} simulated agents every {args.interval:g}s for {beat_for:.0f}s (target "
              f"{args.agents / args.interval:.0f}/s): {ok / beat_for:.0f}/s answered ({phases}), {failed} refused, unanswered or "
              f"not sent for want of a connection ({closed} connections closed by a replica, each opened again); "
              f"{relays:.0f} relayed to their owner; failure verdicts on machines that heartbeat: {len(false)}; "
              f"lease keep-alives failed {lost}, leaderships ended {deposed} (per process)")
        waits = sorted(w for p in pipes for w in p.waits)
        print(f"   before any job was created ({marks[1][1] - BEGAN[0]:.1f}s from the first heartbeat): "
              f"{in_time(pipes, BEGAN[0], marks[1][1], args.interval):.0f}/s of the heartbeats due in those seconds "
              f"answered 200 within the interval ({args.interval:g}s; the region's last line, H), against "
              f"{args.agents / args.interval:.0f}/s due; counted as answers arrived in the same seconds, "
              f"{(marks[1][2] - marks[0][2]) / (marks[1][1] - marks[0][1]):.0f}/s (a window that opens with the first "
              f"heartbeat sent misses those in flight at its end)")
        behind = [c.metric("twine_health_intake_behind_seconds") for c in cs]
        print(f"   an answer came {statistics.median(waits) * 1000:.0f} ms after its heartbeat was written (p50), "
              f"p99 {waits[int(len(waits) * 0.99)]:.2f} s, most {waits[-1]:.2f} s; {waited:,} heartbeats not sent, "
              f"their agent's last one unanswered when due; health checks' intake horizon at the end "
              f"{', '.join(f'{b:.1f}' for b in behind)} s behind (twine_health_intake_behind_seconds)")
        mems = [c.metrics() for c in cs]
        print(f"   usage in the heartbeats: {'none (--no-usage)' if not USAGE else '20 tasks each'}; "
              f"usage history held: {[int(m.get('twine_usage_series', 0)) for m in mems]} series per process "
              f"({sum(m.get('twine_usage_history_bytes', 0) for m in mems) / 2**20:.1f} MiB of arrays of points and "
              f"rollups in all, {H.MINUTES} points and {H.HOURS} rollups at most per series); machines whose usage each holds: "
              f"{[int(m.get('twine_usage_machines_reporting', 0)) for m in mems]}")
        for e in false[:3]:  # what a false verdict said, and how long after the machine's first answer
            m = next(m for m in e["machines"] if m in FIRST_OK)
            print(f"   false: {m} ({e['reason']}) {e['start'] - FIRST_OK[m]:.1f}s after its first answered heartbeat")
        held = [[line for line in c.log.read_text().splitlines() if "event loop was held" in line] for c in cs]
        lags = [c.metrics() for c in cs]
        over = {le: [int(m["twine_event_loop_lag_seconds_count"] - m[f'twine_event_loop_lag_seconds_bucket{{le="{le}"}}'])
                     for m in lags] for le in ("0.1", "0.25", "0.5")}
        print(f"   event loop lag (twine_event_loop_lag_seconds, a 0.1 s sleep every 0.1 s, per process): over 0.1 s "
              f"{over['0.1']}, over 0.25 s {over['0.25']}, over 0.5 s {over['0.5']} times; held for a third of the "
              f"lease or more (warned): {[len(h) for h in held]}")
        for line in [line for h in held for line in h][:5]:
            print(f"   {line[line.index('the event loop'):]}")
        for c in cs:  # where the loop was held (the stalls watcher's stack), the first time in each process
            text = c.log.read_text()
            at = text.find("the event loop has been held")
            if at >= 0:
                print("   " + "\n   ".join(text[at:].split("\n2")[0].splitlines()[:40]))
        per_shard = {s: sum(per_ent.get(f"s{s}-e{e}", 0) for e in range(3)) / args.seconds for s in range(args.shards)}
        print(f"4. allocation: {total / args.seconds:.1f} jobs of 36 tasks/s created (201) over all shards through the "
              f"API ({args.seconds:.0f}s, while the heartbeats go on), measured with 8 closed-loop clients: not a "
              f"capacity figure; per shard: min {min(per_shard.values()):.2f}, max {max(per_shard.values()):.2f} jobs/s")
        reads /= args.seconds / 2
        print(f"5. one shard's capacity at {args.machines:,} machines: {made / args.seconds:.1f} jobs of 36 tasks/s created "
              f"(201) in shard 0 through the API at its leader, {CAPACITY_CLIENTS} closed-loop clients, "
              f"{args.seconds:.0f}s, while the heartbeats go on; baseline: the same clients reading that shard's jobs (GET, "
              f"answered by its leader) {reads:.0f}/s"
              + (f" (ratio {made / args.seconds / reads:.3f})" if reads else " (no job to read: no ratio)") + "; "
              "bench_commit prints the commit path alone")
        status, fleet = cs[0].call("GET", "/v1/fleet?by=dc,msb,entitlement", timeout=120)
        size = len(msgspec.json.encode(fleet))
        f50, c50 = statistics.median(fleet_ms), statistics.median(cluster_ms)
        print(f"6. GET /v1/fleet?by=dc,msb,entitlement at {args.machines:,} machines, 20 requests one after another "
              f"during the heartbeats (after 7.'s scrapes): p50 {f50:.1f} ms, most {max(fleet_ms):.1f} ms; "
              f"{len(fleet.get('cells', []))} cells in {size / 1024:.0f} KiB; baseline GET /v1/cluster (no machine "
              f"in it) p50 {c50:.1f} ms (ratio {f50 / c50:.1f})")
        stall = max(scraped) * 1000
        print(f"7. Prometheus scrapes (GET /v1/metrics), {len(scrapes)} of the {args.processes} processes one after "
              f"another for {args.seconds / 2:.0f}s during the heartbeats: the longest event loop stall of each "
              f"process in those seconds (twine_event_loop_lag_recent_seconds, its stall monitor) "
              f"{', '.join(f'{s * 1000:.0f}' for s in scraped)} ms; baseline, the {args.seconds / 2:.0f}s before "
              f"them with the heartbeats alone: {', '.join(f'{s * 1000:.0f}' for s in quiet)} ms")
        rss_most = max(sum(rss), sum(rss_end))
        print(f"   memory at the end: {', '.join(f'{r:.2f}' for r in rss_end)} GiB per process, {sum(rss_end):.2f} "
              f"together (at the start {sum(rss):.2f}; after each phase: "
              f"{', '.join(f'{phase} {gib:.2f}' for phase, gib in rss_at.items())})")
        size = "1M" if args.machines == 1_000_000 else f"{args.machines / 1000:g}k"
        alone = in_time(pipes, BEGAN[0], marks[1][1], args.interval)  # 3.: no job created meanwhile
        print(f"region {size}: rss {rss_most:.2f} GiB; heartbeats {alone:.0f}/s; one shard "
              f"{made / args.seconds:.1f} jobs/s; fleet {f50:.0f} ms; scrape stall {stall:.0f} ms; false verdicts "
              f"{len(false)}")
    finally:
        for c in cs:
            c.close()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
