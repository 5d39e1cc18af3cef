#!/usr/bin/env bash
# Run the test suite (sets up first; idempotent). Extra arguments go to pytest.
# The VM tests (tests/vm, marker `vm`: the Vagrant region booted with `vagrant up`, about 20
# minutes under emulation) are left out by default; run them with
#   bash scripts/setup-vm.sh && bash scripts/test.sh -m vm
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q -m "not vm" "$@"
