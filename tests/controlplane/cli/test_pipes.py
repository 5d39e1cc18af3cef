"""twinectl into a pipe its reader closes early (`twinectl job list | head -4`): the command ends
quietly, as kubectl does, with no traceback. The real console script in a subprocess, against
ContractServer (the stand-in, so the answer can be made larger than a pipe's buffer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane.cli import samples
from tests.controlplane.cli.contract_server import ContractServer

TWINECTL = Path(sys.executable).parent / "twinectl"  # the console script pyproject.toml installs
JOBS = 3000  # rows: a few hundred KiB either way, far past a pipe's 64 KiB buffer


@pytest.fixture(scope="module")
def server():
    s = ContractServer().start()
    many = [dict(samples.job(), handle=f"web/job-{i:05d}", name=f"job-{i:05d}") for i in range(JOBS)]
    s.reply("GET", "/v1/jobs", 200, {"jobs": many})
    yield s
    s.stop()


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["table", "json"])
def test_a_reader_that_stops_early_ends_the_command_quietly(server, output):
    p = subprocess.Popen([str(TWINECTL), "--url", server.url, "--token", server.token, *output, "job", "list"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[3])
    try:
        assert p.stdout.readline()  # the head of the listing came through ...
        p.stdout.close()  # ... and the reader is gone: the next write fails (EPIPE)
        err = p.stderr.read().decode()
        code = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err == ""
    assert code in (0, 141)  # 141: 128 + SIGPIPE, what a shell shows for a writer whose pipe closed
