"""Simulated agents for control-plane chaos tests (named so: no containers run). Each speaks the
agent's wire protocol to real twine-controld processes: it reads its machine's desired state,
"runs" every task there at once (reports it running at its spec version, with the desired
profile applied), and heartbeats. It records every task start it would have made, so a test can
count restarts: a start is a (job, index, spec_version) that appears in the desired state while
it was not running on this machine.

`urls` are tried in order with failover, as agents do; `follow_hint` makes heartbeats go to the
`heartbeat_to` replica the answer names (as real agents do), or ignores it.

With `poll` cleared, the agents heartbeat what they run without reading their desired state (as
an agent whose long poll hangs on a replica that does not answer, while its heartbeats go to
another). A machine in `cut` neither polls nor heartbeats (a partition: its tasks go on "running"). With
`stop_delay`, a task that leaves a machine's desired state is still reported there (its container
stopping) for that many seconds after its agent learned it left: `stale` holds those.
`overlapped` holds every task that ran (or was still stopping) on two machines at once, noted
as the agents' state changes: a make-before-break move's proof, with no sampling to miss it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

from agent.report import report_digest


class SimAgents:
    def __init__(self, creds: dict[str, str], urls: list[str], interval: float = 0.3, follow_hint: bool = True):
        self.creds = creds
        self.urls = list(urls)
        self.interval = interval
        self.follow_hint = follow_hint
        self.running: dict[str, dict[tuple[str, int], int]] = {m: {} for m in creds}  # machine -> task -> version
        self.starts: Counter = Counter()  # (job, index, version, machine) -> times started
        self.hints: dict[str, str] = {}
        self.sent: Counter = Counter()  # url -> heartbeats it answered
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()
        self.paused = threading.Event()
        self.cut: set[str] = set()
        self.poll = True
        self.desired_profile: dict[str, tuple[str | None, str | None]] = {}  # (name, content hash) applied
        # profile name -> the error an agent reports applying it (it keeps what it had, as agents do)
        self.profile_errors: dict[str, str] = {}
        self.profile_error: dict[str, str] = {}  # machine -> the error it reports now
        self.stop_delay = 0.0
        self.task_cpu: float | None = None  # set: heartbeats carry usage, each running task using this many cores
        # set: heartbeats carry usage, a job's tasks sharing its load (cores) equally; a job not named uses
        # task_cpu. The load is split over the tasks every machine ran when the round began: one split
        # for every report of a round, so that the region's sum is never more than the load (a task
        # started during a round gets its share from the next, as a load balancer learns of it)
        self.job_load: dict[str, float] | None = None
        self._shares: dict[tuple[str, int], float] = {}
        # set: heartbeats carry usage, these tasks using these (cores, MiB), whatever the above say
        self.task_figures: dict[tuple[str, int], tuple[float, float]] = {}
        self.stale: dict[str, dict[tuple[str, int], tuple[int, float]]] = {m: {} for m in creds}  # -> (version, since)
        self.overlapped: set[tuple[str, int]] = set()  # (job, index) seen on two machines at once
        self.answered: dict[str, float] = {}  # machine -> when its last heartbeat was answered (monotonic)
        self.gaps: dict[str, float] = {m: 0.0 for m in creds}  # machine -> the longest time between two answered

    def __enter__(self) -> "SimAgents":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _call(self, url: str, method: str, path: str, cred: str, body: object = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, method=method, data=data,
                                     headers={"Authorization": f"Bearer {cred}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3) as r:
            return json.loads(r.read())

    def _any(self, method: str, path: str, cred: str, body: object = None, first: str | None = None) -> tuple[str, dict]:
        last: Exception | None = None
        for url in ([first] if first else []) + self.urls:
            try:
                return url, self._call(url, method, path, cred, body)
            except (OSError, urllib.error.HTTPError) as e:
                last = e
        raise ConnectionError(f"{path}: no replica answered: {last}")

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.paused.is_set():
                self._shares = self._split()
                for mid, cred in self.creds.items():
                    if mid in self.cut:
                        continue
                    try:
                        self._one(mid, cred)
                    except Exception as e:  # noted; the next round tries again
                        self.errors.append(f"{time.time():.3f} {mid}: {e}")
            self._stop.wait(self.interval)

    def _split(self) -> dict[tuple[str, int], float]:
        load = self.job_load
        if load is None:
            return {}
        with self._lock:
            keys = {k for tasks in self.running.values() for k in tasks if k[0] in load}
        per_job = Counter(j for j, _ in keys)
        return {(j, i): load[j] / per_job[j] for j, i in keys}

    def _one(self, mid: str, cred: str) -> None:
        if not self.poll:
            with self._lock:
                running = dict(self.running[mid])
            self._heartbeat(mid, cred, running, self.desired_profile.get(mid, (None, None)))
            return
        _, desired = self._any("GET", "/v1/agent/desired?wait=0", cred)
        applied = (desired.get("profile"), (desired.get("profile_spec") or {}).get("hash"))
        if applied[0] in self.profile_errors:  # fails: keeps the profile it had
            self.profile_error[mid] = self.profile_errors[applied[0]]
            applied = self.desired_profile.get(mid, (None, None))
        else:
            self.profile_error.pop(mid, None)
        self.desired_profile[mid] = applied
        wanted = {(t["job"], t["index"]): t["spec_version"] for t in desired.get("tasks", [])}
        with self._lock:
            now = self.running[mid]
            for key, version in wanted.items():
                if now.get(key) != version:
                    self.starts[(key[0], key[1], version, mid)] += 1
            stale, t = self.stale[mid], time.monotonic()
            for key, version in now.items():
                if key not in wanted and self.stop_delay > 0:
                    stale.setdefault(key, (version, t))
            for key in [k for k, (_, since) in stale.items() if k in wanted or t - since >= self.stop_delay]:
                del stale[key]
            self.running[mid] = dict(wanted)
            shown = {**{k: v for k, (v, _) in stale.items()}, **wanted}
            on = Counter(k for m in self.running for k in {*self.running[m], *self.stale[m]})
            self.overlapped = self.overlapped | {k for k, n in on.items() if n > 1}  # a new set: read from other threads
        self._heartbeat(mid, cred, shown, applied)

    def _heartbeat(self, mid: str, cred: str, shown: dict, profile: tuple[str | None, str | None]) -> None:
        tasks = [{"job": j, "index": i, "spec_version": v, "state": "running"} for (j, i), v in sorted(shown.items())]
        error = self.profile_error.get(mid, "")
        reported = {"name": profile[0], "hash": profile[1], "ok": not error, "error": error}
        body = {"machine_id": mid, "digest": report_digest(reported, tasks), "tasks": tasks, "profile": reported}
        used = None
        load = self.job_load
        if load is not None:
            shares = self._shares
            used = [[j, i, shares.get((j, i), 0.0) if j in load else self.task_cpu or 0.0, 10.0] for (j, i) in sorted(shown)]
        elif self.task_cpu is not None or self.task_figures:  # as agent/usage.py measures: cores over the window
            used = [[j, i, self.task_cpu or 0.0, 10.0] for (j, i) in sorted(shown)]
        if used is not None:
            used = [[j, i, *self.task_figures.get((j, i), (c, m))] for j, i, c, m in used]
            body["usage"] = {"window": self.interval, "cpus": 64, "cpu": sum(u[2] for u in used) + 0.1,
                             "memory_mb": 100.0 + sum(u[3] for u in used), "memory_total_mb": 65536.0, "tasks": used}
        hinted = self.hints.get(mid) if self.follow_hint else None
        url, answer = self._any("POST", "/v1/agent/heartbeat", cred, body, first=hinted)
        self.sent[url] += 1
        t = time.monotonic()
        if mid in self.answered:
            self.gaps[mid] = max(self.gaps[mid], t - self.answered[mid])
        self.answered[mid] = t
        # as the agent does: the hint holds until a hinted heartbeat fails or an answer names another
        if hinted is not None and url != hinted:
            self.hints.pop(mid, None)
        if answer.get("heartbeat_to"):
            self.hints[mid] = answer["heartbeat_to"]

    def restarts(self) -> dict:
        """Starts beyond the first of each (job, index, version), and tasks started on a second machine."""
        with self._lock:
            again = {k: n for k, n in self.starts.items() if n > 1}
            where: dict[tuple, set] = {}
            for (job, index, _version, mid) in self.starts:
                where.setdefault((job, index), set()).add(mid)
            moved = {k: sorted(v) for k, v in where.items() if len(v) > 1}
        return {"started_again": again, "on_two_machines": moved}

    def versions_started(self, job: str) -> dict[int, list[int]]:
        with self._lock:
            out: dict[int, list[int]] = {}
            for (j, index, version, _mid), n in sorted(self.starts.items()):
                if j == job:
                    out.setdefault(index, []).extend([version] * n)
        return out
