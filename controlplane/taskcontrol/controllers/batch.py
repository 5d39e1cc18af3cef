"""batch: the TaskController of an opportunistic batch job (issue #37).

A reclaim (its machines taken back for a guaranteed entitlement) is first heard of as an advance
notice with a deadline; a batch task that can save its work hands its machine back early. This
controller acks a task's `reclaim` once the task has had its notice for `--checkpoint` seconds (the
time it takes to save its work: 0 acks at the first call that carries both), and the other
operations (updates, moves, maintenance) one task at a time.

    python -m controlplane.taskcontrol.controllers.batch --listen 127.0.0.1:9091 --checkpoint 5
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Callable

from controlplane.taskcontrol.sdk import Operation, Request, TaskController, run, token_file

log = logging.getLogger("twine.taskcontrol.batch")


class Batch(TaskController):
    def __init__(self, checkpoint: float = 0.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.checkpoint, self.clock = checkpoint, clock
        self.noticed: dict[int, float] = {}  # task index under a reclaim notice -> when this controller first saw it
        self.handed_back: list[int] = []  # tasks whose reclaim it acked, in order

    def decide(self, request: Request) -> list[Operation]:
        now = self.clock()
        covered = {i for n in request.notices if n.kind == "reclaim" for i in n.tasks}
        # a task no longer under notice is forgotten: placed again and reclaimed again, it gets
        # its checkpoint time again
        self.noticed = {i: self.noticed.get(i, now) for i in covered}
        acks = [op for op in request.ops if op.kind == "reclaim" and op.index in covered
                and now - self.noticed[op.index] >= self.checkpoint]
        for op in acks:
            log.info("reclaim of task %d acked, %.1f s after its notice", op.index, now - self.noticed[op.index])
        self.handed_back += [op.index for op in acks]
        if not self.in_flight and not acks:
            other = [op for op in request.ops if op.kind != "reclaim"]
            acks += other[:1]
        return acks


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="batch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:9091", help="HOST:PORT to serve the TaskControl protocol on")
    p.add_argument("--checkpoint", type=float, default=0.0, metavar="S",
                   help="seconds a task takes to save its work once its reclaim is noticed (default 0)")
    p.add_argument("--token-file", type=Path, help="file holding the job's controller_token: calls without it are refused")
    args = p.parse_args(argv)
    if args.checkpoint < 0:
        p.error(f"--checkpoint {args.checkpoint:g}: seconds, 0 or more")
    logging.basicConfig(level=logging.INFO)
    host, _, port = args.listen.rpartition(":")
    run(Batch(args.checkpoint), host, int(port), token_file(p, args.token_file))


if __name__ == "__main__":
    main()
