#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs agentax with its test extras.
# torch comes from the CPU wheel pinned here, installed first so nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e '.[test]'
