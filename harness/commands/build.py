"""`benchfarm build`: build an engine for a target and print the build record as JSON."""

from __future__ import annotations

import argparse
import os

from devices.inventory import ARCHES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build", help="build the lmc engine with ninja (or "
                                   "llama.cpp's llama-bench with CMake)")
    parser.add_argument("--engine", choices=("lmc", "llama-bench"), default="lmc")
    parser.add_argument("--target", choices=ARCHES, default=os.uname().machine,
                        help="default: this machine's, %(default)s")
    parser.add_argument("--isa", help="instruction-set level (devices.isa: v2, v3, v4, v4-vnni; "
                        "armv8-a, armv8.2-a+dotprod, armv8.2-a+i8mm); default: this machine's "
                        "highest for its own arch, armv8.2-a+dotprod for aarch64 from x86_64")
    parser.add_argument("--rev", help="git revision to build (default: the working tree; "
                        "llama-bench: a revision of --source)")
    parser.add_argument("--variant", default="release",
                        help="lmc only: release (default) or asan")
    parser.add_argument("--toolchain", choices=("gcc", "zig"), default="gcc", help="lmc only")
    parser.add_argument("--source", help="llama-bench only: 'pypi' (the default: the "
                        "llama.cpp vendored in the llama-cpp-python sdist) or a llama.cpp tree")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.engines.llamabench.build import PYPI, build_llama_bench
    from harness.engines.lmc.build import VARIANTS, build_engine
    from harness.errors import InputError

    target = f"{args.target}:{args.isa}" if args.isa else args.target
    if args.engine == "llama-bench":
        record = build_llama_bench(target, args.source or PYPI, args.rev)
    else:
        if args.variant not in VARIANTS:
            raise InputError(f"--variant {args.variant!r}: allowed {', '.join(VARIANTS)}")
        record = build_engine(
            target=target, rev=args.rev, variant=args.variant, toolchain_name=args.toolchain
        )
    print(record.to_json())
    return 0
