"""The Vagrant region, brought up once per test session with the same `vagrant up` users run:
a control VM and two machine VMs. Under CI=true a missing part fails the tests; elsewhere they
are skipped. TWINE_VM_KEEP=1 leaves the region up at the end, and a region that is up is then
used as it is (for working on the tests; CI always starts from nothing)."""

from __future__ import annotations

import os

import pytest

from tests.vm.region import MACHINES, Region, missing_tools

__all__ = ["MACHINES"]


@pytest.fixture(scope="session")
def region():
    missing = missing_tools()
    if missing:
        message = f"the VM region needs {missing} (bash scripts/setup-vm.sh installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    keep = os.environ.get("TWINE_VM_KEEP") == "1" and os.environ.get("CI") != "true"
    r = Region()
    try:
        if not (keep and r.is_up()):
            r.up()
    except BaseException:
        if not keep:
            r.down()
        raise
    yield r
    if not keep:
        r.down()
