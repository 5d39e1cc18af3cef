#!/usr/bin/env bash
# Run the test suite (sets up first; idempotent). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
