#!/usr/bin/env bash
# The test command: install everything, lint, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
# The store is also tested against a throw-away PostgreSQL cluster on 127.0.0.1.
export BENCHFARM_TEST_POSTGRES=1
# llama.cpp's llama-bench is built once per machine into ~/.cache/benchfarm/llama-cpp (keyed by
# its source and flags; both targets in the background while the other tests run, the first
# time) for the tests that need it, and reused from there by every later run: none is skipped.
.venv/bin/python -m pytest -q --durations=20 "$@"
