#!/usr/bin/env bash
# Run the whole test suite (sets up first; idempotent). Extra arguments go to pytest.
# It includes the VM tests (tests/vm, marker `vm`): the Vagrant region, booted with the same
# `vagrant up` users run. With no arguments they run in a second pytest process beside the
# others: the region boots while the other tests run and its tests begin as soon as it is up
# (about 16 minutes in on a 2-core host, where the others take about 25), so the two overlap
# instead of adding up. Their report follows the others' (and is kept in
# vagrant/.region/pytest-vm.log); the run fails if either fails.
# With arguments, one pytest process runs what they select, VM tests last.
# Without the VM tests: bash scripts/test.sh -m "not vm"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-vm.sh
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q --durations=40 "$@"  # the slowest, to see where the time goes
fi

mkdir -p vagrant/.region
vmlog=vagrant/.region/pytest-vm.log
vmtmp=$(mktemp -d /tmp/twine-vm-tests.XXXXXX)
# its own temporary directory and no cache: the two processes share nothing pytest writes
.venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$vmtmp/t" --durations=20 -m vm >"$vmlog" 2>&1 &
vm=$!
trap 'kill -INT "$vm" 2>/dev/null || true' INT TERM
rc=0
.venv/bin/python -m pytest -q --durations=40 -m "not vm" || rc=$?
echo "-- the VM tests (pid $vm; their report as it is written: $vmlog) --"
vmrc=0
wait "$vm" || vmrc=$?
trap - INT TERM
cat "$vmlog"
rm -rf "$vmtmp"
echo "-- tests other than the VM tests: exit $rc; the VM tests: exit $vmrc --"
[ "$rc" -eq 0 ] && [ "$vmrc" -eq 0 ]
