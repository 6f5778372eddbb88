"""`benchfarm build`: build lmc for a target and print the build record as JSON."""

from __future__ import annotations

import argparse

from harness.build import TARGETS, VARIANTS, build_engine, host_arch


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build", help="build the lmc engine with ninja")
    parser.add_argument("--target", choices=TARGETS, default=host_arch())
    parser.add_argument("--rev", help="git revision to build (default: the working tree)")
    parser.add_argument("--variant", choices=VARIANTS, default="release")
    parser.add_argument("--toolchain", choices=("gcc", "zig"), default="gcc")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    record = build_engine(
        target=args.target, rev=args.rev, variant=args.variant, toolchain_name=args.toolchain
    )
    print(record.to_json())
    return 0
