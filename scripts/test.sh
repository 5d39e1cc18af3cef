#!/usr/bin/env bash
# Run the whole test suite (sets up first; idempotent). Extra arguments go to pytest.
# It includes the VM tests (tests/vm, marker `vm`): the Vagrant region, booted with the same
# `vagrant up` users run, comes up in the background while the other tests run, and its tests run
# last. Without them: bash scripts/test.sh -m "not vm"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-vm.sh
exec .venv/bin/python -m pytest -q --durations=40 "$@"  # the slowest, to see where the time goes
