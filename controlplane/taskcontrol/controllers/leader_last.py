"""leader-last: the TaskController of a ZooKeeper-style ensemble (paper section 2.5).

Followers are updated first and the leader last, one member at a time, and never while another
member is down: an n-member ensemble then has one leader failover per release, not up to n.

The leader is found by `leader()`: the program reads it from `--leader-file` (the task index the
ensemble last elected, written by the ensemble) or `--leader-url` (an HTTP endpoint answering the
index), at every call.

    python -m controlplane.taskcontrol.controllers.leader_last --listen 127.0.0.1:9090 --leader-file /run/zk/leader
"""

from __future__ import annotations

import argparse
import logging
import urllib.request
from pathlib import Path
from typing import Callable

from controlplane.taskcontrol.sdk import Request, TaskController, run, token_file


class LeaderLast(TaskController):
    def __init__(self, leader: Callable[[], int | None]):
        super().__init__()
        self.leader = leader

    def decide(self, request: Request) -> list[str]:
        if self.in_flight:
            return []  # one member at a time
        leader = self.leader()
        for op in sorted(request.ops, key=lambda op: (op.index == leader, op.index)):
            if request.unhealthy_indices() - {op.index}:
                continue  # another member is down: taking this one down too could cost the quorum
            return [op.id]
        return []


def file_leader(path: Path) -> Callable[[], int | None]:
    def read() -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None
    return read


def url_leader(url: str) -> Callable[[], int | None]:
    def read() -> int | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.read().decode().strip())
        except (OSError, ValueError):
            return None
    return read


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="leader-last", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:9090", help="HOST:PORT to serve the TaskControl protocol on")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--leader-file", type=Path, help="file holding the leader's task index")
    src.add_argument("--leader-url", help="URL answering the leader's task index")
    p.add_argument("--token-file", type=Path, help="file holding the job's controller_token: calls without it are refused")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    host, _, port = args.listen.rpartition(":")
    leader = file_leader(args.leader_file) if args.leader_file else url_leader(args.leader_url)
    run(LeaderLast(leader), host, int(port), token_file(p, args.token_file))


if __name__ == "__main__":
    main()
