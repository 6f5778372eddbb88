#!/usr/bin/env bash
# The test command: install everything, lint, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
# The store is also tested against a throw-away PostgreSQL cluster on 127.0.0.1.
export BENCHFARM_TEST_POSTGRES=1
# llama.cpp's llama-bench takes many minutes to build on two cores (docs/performance.md), more
# than the suite's budget: its tests run once both targets are built and cached under
# build/llama-cpp (`benchfarm build --engine llama-bench --target x86_64`, then aarch64), or
# with BENCHFARM_TEST_LLAMACPP=1 set by hand (which builds them).
if compgen -G "build/llama-cpp/x86_64-*/bin/llama-bench" >/dev/null &&
   compgen -G "build/llama-cpp/aarch64-*/bin/llama-bench" >/dev/null; then
  export BENCHFARM_TEST_LLAMACPP="${BENCHFARM_TEST_LLAMACPP:-1}"
fi
.venv/bin/python -m pytest -q --durations=20 "$@"
