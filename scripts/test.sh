#!/usr/bin/env bash
# The test command: install everything, lint, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=20 "$@"
