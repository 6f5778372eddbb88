#!/usr/bin/env bash
# The test command: install everything, lint, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
# The store is also tested against a throw-away PostgreSQL cluster on 127.0.0.1.
export BENCHFARM_TEST_POSTGRES=1
.venv/bin/python -m pytest -q --durations=20 "$@"
