#!/usr/bin/env bash
# Sets up ./.venv and runs the default test suite (the README's test command), on
# $AGENTAX_TEST_WORKERS pytest-xdist workers (default 2; a test module stays on one worker, so its
# module-wide fixtures are built once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -n "${AGENTAX_TEST_WORKERS:-2}" --dist loadfile "$@"
