"""benchfarm coordinator: command line, specs, matrices, builds, scheduling, workloads."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ENGINE_DIR = REPO_ROOT / "engine"
