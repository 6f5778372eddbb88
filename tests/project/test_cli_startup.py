"""The command line builds its parser and prints every help without the heavy libraries, and
the read commands `queue` and `status` import only the store's (the time they take is
measured in bench/cli_startup.py, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# What the read commands need is the store (SQLAlchemy and the models) and their own command
# module; not the planner, the engines, the workloads' tokenizer and templates, the farm, Ray,
# the report libraries, the inventory, or the other commands' modules (a call registers only
# the subcommand it names).
NOT_FOR_READING = (*(m for m in HEAVY if m not in ("sqlalchemy",)), "jinja2", "tokenizers",
                   "harness.plan.matrix", "harness.engines", "harness.workloads",
                   "devices.farm", "devices.health", "devices.inventory",
                   "harness.commands.run", "harness.commands.build", "harness.commands.web")

READ = f"""
import contextlib, io, json, sys
from harness.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps([code, sorted(m for m in {NOT_FOR_READING!r} if m in sys.modules)]))
"""


@pytest.mark.parametrize("command", ["queue", "status"])
def test_read_commands_import_only_the_store(command: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    db = f"sqlite:///{tmp_path}/read.db"
    subprocess.run([sys.executable, "-c", f"from db.store import Store; Store.open({db!r})"],
                   env=env, check=True, cwd=tmp_path)
    out = subprocess.run([sys.executable, "-c", READ, "--db", db, command],
                         capture_output=True, text=True, env=env, check=True, cwd=tmp_path)
    assert json.loads(out.stdout) == [0, []], out.stderr


@pytest.mark.parametrize(("argv", "command"), [
    (["queue"], "queue"),
    (["--db", "queue", "status"], "status"),  # the store's URL is no command, even "queue"
    (["--db=sqlite:///x.db", "status", "run"], "status"),
    (["--d", "sqlite:///x.db", "status"], "status"),  # argparse's prefix of --db
    (["--help", "queue"], None),  # the whole parser answers a top-level option
    (["nope"], None),
    ([], None),
])
def test_a_call_is_parsed_by_the_command_it_names(argv: list[str], command: str | None) -> None:
    from harness.cli import named_command

    assert named_command(argv) == command
