"""replica-aware: the TaskController of a sharded service whose shards have replicas on several
tasks (paper Figure 2 and section 5.1).

An operation is approved only if none of its task's shards would have more than `max_down`
replicas down (default 1), counting the tasks that are already unhealthy for any reason and the
operations approved earlier that have not completed. A shard already past the limit because of a
failure blocks the operations on its own tasks, not those of unrelated shards. Batches are shaped around failures: operations on tasks
that share no shard with a down task are taken first, greedily, in the order that fits the most.

    python -m controlplane.taskcontrol.controllers.replica_aware --listen 127.0.0.1:9091 --shards shards.json
    # shards.json: {"A": [1, 3], "B": [2, 5, 6], "C": [1, 4, 7], "D": [2, 3, 6]}  (shard -> task indices)
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Mapping

from controlplane.taskcontrol.sdk import Request, TaskController, run


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

        def crowding(op) -> tuple[int, int]:  # replicas already down in the op's shards, then index
            return (sum(count.get(sh, 0) for sh in self.by_task.get(op.index, ())), op.index)

        approved = []
        for op in sorted(request.ops, key=crowding):
            shards = self.by_task.get(op.index, ())
            if op.index in down:  # down anyway: operating on it takes no further replica down
                approved.append(op.id)
            elif all(count.get(sh, 0) < self.max_down for sh in shards):
                approved.append(op.id)
                down.add(op.index)
                for sh in shards:
                    count[sh] = count.get(sh, 0) + 1
        return approved


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="replica-aware", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:9091", help="HOST:PORT to serve the TaskControl protocol on")
    p.add_argument("--shards", type=Path, required=True, help="JSON: shard name -> list of task indices")
    p.add_argument("--max-down", type=int, default=1, help="replicas of one shard that may be down at once")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        shards = json.loads(args.shards.read_text())
    except (OSError, ValueError) as e:
        p.error(f"--shards {args.shards}: {e}")
    host, _, port = args.listen.rpartition(":")
    run(ReplicaAware(shards, args.max_down), host, int(port))


if __name__ == "__main__":
    main()
