"""replica-aware: the TaskController of a sharded service whose shards have replicas on several
tasks (paper Figure 2 and section 5.1).

A set of operations is approved only if no shard would have more than `max_down` replicas down
(default 1), counting the tasks that are already unhealthy for any reason and the operations
approved earlier that have not completed. Batches are shaped around failures: operations on tasks
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
        self.by_task: dict[int, list[frozenset[int]]] = {}
        for replicas in self.shards.values():
            for t in replicas:
                self.by_task.setdefault(t, []).append(replicas)
        self.max_down = max_down

    def fits(self, down: set[int]) -> bool:
        return all(len(down & replicas) <= self.max_down for replicas in self.shards.values())

    def decide(self, request: Request) -> list[str]:
        down = request.unhealthy_indices() | {op.index for op in self.in_flight.values()}

        def crowding(op) -> tuple[int, int]:  # replicas already down in the op's shards, then index
            return (sum(len(down & r) for r in self.by_task.get(op.index, ())), op.index)

        approved = []
        for op in sorted(request.ops, key=crowding):
            trial = down | {op.index}
            if op.index in down or self.fits(trial):
                approved.append(op.id)
                down = trial
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
