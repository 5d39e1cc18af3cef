"""replica-aware: the TaskController of a sharded service whose shards have replicas on several
tasks (paper Figure 2 and section 5.1).

An operation is approved only if none of its task's shards would have more than `max_down`
replicas down (default 1), counting the tasks that are already unhealthy for any reason and the
operations approved earlier that have not completed. A shard already past the limit because of a
failure blocks the operations on its own tasks, not those of unrelated shards. Within that, the
largest batch it can find: minimum-degree-first over the conflicts between the candidates (on
Figure 2: tasks 3, 4 and 5 together). Batches are shaped around failures: a task sharing a shard
with a down task waits, and the batch is built from the others.

    python -m controlplane.taskcontrol.controllers.replica_aware --listen 127.0.0.1:9091 --shards shards.json
    # shards.json: {"A": [1, 3], "B": [2, 5, 6], "C": [1, 4, 7], "D": [2, 3, 6]}  (shard -> task indices)
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
from pathlib import Path
from typing import Mapping

from controlplane.taskcontrol.sdk import Request, TaskController, run, token_file


class ReplicaAware(TaskController):
    def __init__(self, shards: Mapping[str, set[int] | list[int]], max_down: int = 1):
        super().__init__()
        self.shards = {name: frozenset(tasks) for name, tasks in shards.items()}
        # task index -> the shards it hosts a replica of (shard numbers): a decision touches only
        # the shards of the tasks involved, not all of them (15,000 shards in paper section 5.1)
        self.by_task: dict[int, list[int]] = {}
        for n, replicas in enumerate(self.shards.values()):
            for t in replicas:
                self.by_task.setdefault(t, []).append(n)
        self.max_down = max_down

    def decide(self, request: Request) -> list[str]:
        down = request.unhealthy_indices() | {op.index for op in self.in_flight.values()}
        count: dict[int, int] = {}  # shard -> replicas down
        for t in down:
            for sh in self.by_task.get(t, ()):
                count[sh] = count.get(sh, 0) + 1

        def feasible(t: int) -> bool:
            return all(count.get(sh, 0) < self.max_down for sh in self.by_task.get(t, ()))

        # an operation on a task that is down anyway takes no further replica down
        approved = [op.id for op in request.ops if op.index in down]
        cand = {op.index: op for op in request.ops if op.index not in down and feasible(op.index)}
        # Two candidates conflict when, together, they would take a shard past the limit. The batch
        # is built minimum-degree first: a task that conflicts with few others costs few, and as
        # a batch grows the tasks it leaves possible are those that fit with it, so a service whose
        # replicas are spread over groups of tasks gets a whole group at once (paper 5.1: 274 of 1,000).
        by_shard: dict[int, list[int]] = {}
        for t in cand:
            for sh in self.by_task.get(t, ()):
                by_shard.setdefault(sh, []).append(t)
        nbrs: dict[int, set[int]] = {t: set() for t in cand}
        for sh, ts in by_shard.items():
            if len(ts) > 1 and count.get(sh, 0) + 2 > self.max_down:
                for t in ts:
                    nbrs[t].update(ts)
        for t in cand:
            nbrs[t].discard(t)
        degree = {t: len(n) for t, n in nbrs.items()}
        heap = [(d, t) for t, d in degree.items()]
        heapq.heapify(heap)
        alive = set(cand)
        while heap:
            d, t = heapq.heappop(heap)
            if t not in alive or d != degree[t]:
                continue  # taken, ruled out, or a stale entry
            alive.discard(t)
            if not feasible(t):
                continue
            approved.append(cand[t].id)
            for sh in self.by_task.get(t, ()):
                count[sh] = count.get(sh, 0) + 1
            for n in nbrs[t]:
                if n in alive and not feasible(n):
                    alive.discard(n)
                    for m in nbrs[n]:
                        if m in alive:
                            degree[m] -= 1
                            heapq.heappush(heap, (degree[m], m))
        return approved


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="replica-aware", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:9091", help="HOST:PORT to serve the TaskControl protocol on")
    p.add_argument("--shards", type=Path, required=True, help="JSON: shard name -> list of task indices")
    p.add_argument("--max-down", type=int, default=1, help="replicas of one shard that may be down at once")
    p.add_argument("--token-file", type=Path, help="file holding the job's controller_token: calls without it are refused")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        shards = json.loads(args.shards.read_text())
    except (OSError, ValueError) as e:
        p.error(f"--shards {args.shards}: {e}")
    host, _, port = args.listen.rpartition(":")
    run(ReplicaAware(shards, args.max_down), host, int(port), token_file(p, args.token_file))


if __name__ == "__main__":
    main()
