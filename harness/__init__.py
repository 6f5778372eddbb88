"""benchfarm coordinator: command line, specs, matrices, builds, scheduling, workloads."""

import os
from pathlib import Path

# The checkout. A Ray worker imports this package from a copy that runtime_env shipped, so a
# build task on the driver's node is told where the checkout is
# (see harness.execution.cluster.build_on_ray).
REPO_ROOT = Path(os.environ.get("BENCHFARM_REPO_ROOT") or Path(__file__).resolve().parent.parent)
ENGINE_DIR = REPO_ROOT / "engine"
# The model a claims experiment runs when it names none (harness.verify.claims).
DEFAULT_MODEL = REPO_ROOT / "models" / "needle-tiny"
