#!/usr/bin/env bash
# Sets up ./.venv and runs the default test suite (the README's test command) on
# $AGENTAX_TEST_WORKERS pytest-xdist workers (2 by default; 0 runs it in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -n "${AGENTAX_TEST_WORKERS:-2}" --dist loadgroup "$@"
