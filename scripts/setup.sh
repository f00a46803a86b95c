#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs agentax with its test extras.
# torch comes from the CPU wheel pinned here, installed first so nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The code sandbox (agentax.tools.Sandbox) confines programs with bubblewrap; setpriv and prlimit
# come from util-linux. The tests open the page of `agentax show --html` in a headless Chromium
# (tests/cli/test_transcripts.py; skipped without it). Installed only when running as root on
# Debian (otherwise ask an admin).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  command -v bwrap >/dev/null || missing+=(bubblewrap util-linux)
  command -v chromium >/dev/null || missing+=(chromium)
  # BrowserEnvironment's browser: Chromium's headless-only build, lighter per episode.
  command -v chromium-headless-shell >/dev/null || missing+=(chromium-headless-shell)
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e '.[test]'
# The MiniWoB++ task pages for BrowserEnvironment: only the package's HTML is used, so not its
# Selenium driver and friends.
python -m pip install -q --no-deps "miniwob==1.1.0"
# The swe_real recipe's repository snapshots: small pure-Python packages' sdists (with their own
# tests), pinned as the shipped instances (src/agentax/recipes/data/swe_real.jsonl) expect.
SDISTS=${AGENTAX_SDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentax/sdists}
mkdir -p "$SDISTS"
python -m pip download -q --no-deps --no-binary :all: -d "$SDISTS" inflection==0.5.1 parse==1.22.4 cachetools==8.0.2
