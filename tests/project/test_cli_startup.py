"""The command line builds its parser and prints every help without the heavy libraries (the
time it takes is measured in bench/cli_startup.py, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("ray", "scipy", "pandas", "sqlalchemy", "alembic", "matplotlib", "numpy", "paramiko")

PROBE = f"""
import contextlib, io, json, sys
from harness.cli import SUBCOMMANDS, build_parser
parser = build_parser()
for argv in [["--help"], *([name, "--help"] for name in SUBCOMMANDS)]:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit:
            pass
print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""


def test_parser_and_every_help_import_nothing_heavy() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, check=True, cwd=REPO).stdout
    assert json.loads(out) == []
