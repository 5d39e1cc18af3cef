"""Huge pages on the real kernel: counts really change and are restored."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import ProfileError
from agent.profiles.appliers.base import HostContext
from agent.profiles.appliers.hugepages import HugePages
from agent.profiles.model import Differs, Holds
from tests.conftest import missing_part

NR_2M = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
NR_1G = Path("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages")


@pytest.fixture
def applier() -> HugePages:
    return HugePages(HostContext())


def test_2m_count_is_set_for_real_and_restored(applier, host_files):
    host_files.save(NR_2M)
    before = applier.read("2M")
    want = 16 if before != 16 else 32
    settings = applier.parse({"2048kB": want}, "test.toml")
    assert [(s.key, s.value) for s in settings] == [("2M", want)]
    applier.check(settings)

    applier.write("2M", want)
    assert int(NR_2M.read_text()) == want
    assert applier.verify("2M", want) == Holds()

    applier.write("2M", before)
    assert int(NR_2M.read_text()) == before
    assert applier.verify("2M", before) == Holds()


def test_count_the_host_cannot_hold_is_refused_before_any_write(applier):
    before = NR_2M.read_text()
    settings = applier.parse({"2M": 10**7}, "test.toml")
    with pytest.raises(ProfileError) as e:
        applier.check(settings)
    assert e.value.field == "[hugepages] 2M"
    assert "needs 20000000 MiB" in e.value.why and "MiB available" in e.value.why
    assert NR_2M.read_text() == before


@pytest.mark.parametrize("key", ["3M", "2MB", "2M@nodeX", "huge"])
def test_unknown_page_size_is_a_profile_error(applier, key):
    with pytest.raises(ProfileError) as e:
        applier.parse({key: 1}, "test.toml")
    assert e.value.field == f"[hugepages] {key}" and "not a huge page size" in e.value.why


@pytest.mark.parametrize("count", [-1, True, "16", 1.5])
def test_count_must_be_a_non_negative_integer(applier, count):
    with pytest.raises(ProfileError, match="non-negative count"):
        applier.parse({"2M": count}, "test.toml")


def test_unknown_numa_node_is_refused_by_check(applier):
    settings = applier.parse({"2M@node63": 1}, "test.toml")
    with pytest.raises(ProfileError, match="no NUMA node 63"):
        applier.check(settings)


def test_page_size_without_a_sysfs_directory_is_not_applicable(tmp_path):
    (tmp_path / "kernel/mm/hugepages/hugepages-2048kB").mkdir(parents=True)
    verdict = HugePages(HostContext(sys=tmp_path)).applicable("1G")
    assert verdict is not None and "no 1G huge pages" in verdict.why and "hugepages-1048576kB" in verdict.why


def test_1g_verify_reports_what_the_kernel_reached(applier, host_files):
    """One more 1G page than the host has: the kernel either finds a free 1 GiB block or falls
    short, and verify says which, with the count the kernel reached (a request it surely cannot
    meet would take all of a shared test host's free memory, so the outcome is the kernel's)."""
    if not NR_1G.exists():
        missing_part(f"1G huge pages (no {NR_1G})")
    host_files.save(NR_1G)
    before = applier.read("1G")
    want = before + 1
    assert applier.verify("1G", want) == Differs(before, f"reached {before} of {want} 1G pages (short 1)")
    applier.check(applier.parse({"1G": want}, "test.toml"))
    applier.write("1G", want)
    try:
        reached, verdict = int(NR_1G.read_text()), applier.verify("1G", want)
    finally:
        applier.write("1G", before)
    assert applier.read("1G") == before
    if reached == want:
        assert verdict == Holds()
    else:
        assert verdict == Differs(reached, f"reached {reached} of {want} 1G pages (short {want - reached})")
