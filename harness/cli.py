"""The `benchfarm` command line: one module per subcommand under ``harness.commands``.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets
``func`` to a callable taking the parsed namespace and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from harness.errors import printable, sigterm_as_interrupt, terminated

SUBCOMMANDS = [
    "build",
    "workload",
    "farm",
    "devices",
    "run",
    "submit",
    "serve",
    "queue",
    "cancel",
    "wait",
    "logs",
    "reserve",
    "release",
    "users",
    "gc",
    "status",
    "runs",
    "export",
    "report",
    "compare",
    "history",
    "bisect",
    "track",
    "alerts",
    "audit",
    "reproduce",
    "demo",
    "predictor",
    "web",
]

DEFAULT_DB = "sqlite:///benchfarm.db"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with ``only`` that one: a command's own parser
    is all a call of it needs, and registering the others costs their modules' imports."""
    parser = argparse.ArgumentParser(
        prog="benchfarm",
        description="Benchmark the lmc engine on a farm of devices and audit published numbers.",
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("BENCHFARM_DB", DEFAULT_DB),
        help="SQLAlchemy URL of the result store (default: $BENCHFARM_DB or %(default)s)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only else SUBCOMMANDS:
        importlib.import_module(f"harness.commands.{name}").register(subparsers)
    return parser


# The exit status of a filter whose reader went away (128 + SIGPIPE), as `yes | head` gives.
CLOSED_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # what is still buffered: a closed pipe shows here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        # `benchfarm status | head`: the reader has what it wanted. Stop quietly, as a Unix
        # filter does, and point stdout at /dev/null so that Python's final flush of what is
        # still buffered cannot fail again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE


def named_command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names before any other argument but ``--db`` (its parser alone
    parses the call), or None: no subcommand, a top-level option such as --help, or a name
    that is no subcommand, which the whole parser answers."""
    tokens = iter(argv)
    for token in tokens:
        if token.startswith("--db="):
            continue
        if len(token) > 2 and "--db".startswith(token):  # argparse takes prefixes of options
            next(tokens, None)
            continue
        return token if token in SUBCOMMANDS else None
    return None


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(named_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    sigterm_as_interrupt()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if terminated():
            print("benchfarm: stopped by SIGTERM", file=sys.stderr)
            return 143
        print("benchfarm: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - mapped to exit codes below
        code = getattr(type(exc), "exit_code", None)
        if code is None:
            raise
        print(f"benchfarm: error: {printable(str(exc))}", file=sys.stderr)
        return int(code)


if __name__ == "__main__":
    sys.exit(main())
