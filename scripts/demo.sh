#!/usr/bin/env bash
# The main job: install everything, then build lmc, run the demo matrix and render its report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/benchfarm demo "$@"
