"""When the machine index and the filters (the definition it must agree with) disagree, the
allocator raises AllocatorInconsistency naming the job, the task, the machine and what disagreed:
a bug, not a user's error (no AllocationError, so never a 4xx), and a check that holds under -O.

Each test puts the index out of step on purpose, by writing the snapshot's machines behind its
back (never done outside these tests: `Snapshot.apply` changes both)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.allocator import AllocationError, allocate
from controlplane.allocator.errors import AllocatorInconsistency

from .builders import job, make_machine, snapshot


def behind_the_index(snap, machine) -> None:
    snap._machines[machine.id] = machine  # the machines change, the index does not hear of it


def test_a_pick_the_filters_refuse_names_the_machine_and_the_filter():
    m = make_machine("m0")
    snap = snapshot([m])
    behind_the_index(snap, replace(m, healthy=False))  # the index still holds it as healthy
    with pytest.raises(AllocatorInconsistency) as e:
        allocate(snap, job("ent/web", count=1))
    assert not isinstance(e.value, AllocationError)
    assert (e.value.job, str(e.value)) == ("ent/web", "allocator inconsistency placing ent/web: the allocator's "
                                           "index and its filters disagree: the index picked machine m0 for task 0, "
                                           "which the filters refuse: healthy (healthy)")


def test_no_pick_where_the_filters_pass_a_machine_names_it():
    sick = make_machine("m0", healthy=False)
    snap = snapshot([sick, make_machine("m1", healthy=False)])  # the index holds no schedulable machine
    behind_the_index(snap, replace(sick, healthy=True))
    with pytest.raises(AllocatorInconsistency) as e:
        allocate(snap, job("ent/web", count=1))
    assert str(e.value) == ("allocator inconsistency placing ent/web: the allocator's index and its filters "
                            "disagree: the index found no machine for task 0, the filters pass 1 (e.g. m0)")


def test_an_index_update_that_cannot_find_a_machines_entry_names_the_machine_and_its_bin():
    m = make_machine("m0", cpus=4)
    snap = snapshot([m])
    for b in snap.index.bins("msb", "sky", None).values():
        b.clear()  # its entry is gone from its msb bin
    with pytest.raises(AllocatorInconsistency) as e:
        snap.apply(machines=[replace(m, cpus=8)])
    assert e.value.job is None
    assert str(e.value) == ("allocator inconsistency: the allocator's index is out of step with machine m0: its "
                            "entry (free cpus 4, memory 8192 MB) is not in its msb bin reg/dc1/m1")


def test_the_check_holds_under_python_O():
    script = """
from dataclasses import replace
from controlplane.allocator import allocate
from controlplane.allocator.errors import AllocatorInconsistency
from tests.controlplane.allocator.builders import job, make_machine, snapshot
m = make_machine("m0")
snap = snapshot([m])
snap._machines["m0"] = replace(m, healthy=False)
try:
    allocate(snap, job("ent/web"))
except AllocatorInconsistency as e:
    print(type(e).__name__, e.job)
"""
    r = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).parents[3], check=False)
    assert (r.returncode, r.stdout, r.stderr) == (0, "AllocatorInconsistency ent/web\n", "")
