"""The Vagrant region, brought up once per test session with the same `vagrant up` users run:
a control VM, two machine VMs and a spare whose agent is held (tests/vm/region.py). It boots in the background from the moment the VM tests are
collected (tests/conftest.py starts it and orders the VM tests last), so the other tests run
meanwhile. Under CI=true a missing part fails the tests; elsewhere they are skipped.
TWINE_VM_KEEP=1 leaves the region up at the end, and a region that is up is then used as it is
(for working on the tests; CI always starts from nothing)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import BRINGUP
from tests.vm.region import MACHINES, missing_tools

__all__ = ["MACHINES"]


@pytest.fixture(scope="session")
def region(request):
    missing = missing_tools()
    if missing:
        message = f"the VM region needs {missing} (bash scripts/setup-vm.sh installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    bringup = request.config.stash[BRINGUP]
    return bringup.wait()
