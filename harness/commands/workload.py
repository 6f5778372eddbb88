"""`benchfarm workload needle|ppl|decode`: print a workload's token ids as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.errors import InputError, RunFailure


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("workload", help="print a workload prompt (token ids) as JSON")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)

    needle = kinds.add_parser("needle", help="needle-in-a-haystack chat prompt")
    needle.add_argument("--ctx", type=int, required=True, help="prompt length in tokens")
    needle.add_argument("--depth", type=float, required=True, help="needle depth in [0, 1]")

    ppl = kinds.add_parser("ppl", help="held-out text for perplexity")
    ppl.add_argument("--length", type=int, required=True, help="number of tokens")
    ppl.add_argument("--text", type=Path,
                     help="a UTF-8 text file; seed S takes its S-th window of --length tokens")

    decode = kinds.add_parser("decode", help="chat prompt for pure decode-speed runs")
    decode.add_argument("--ctx", type=int, required=True, help="prompt length in tokens")

    for sub in (needle, ppl, decode):
        sub.add_argument("--model", type=Path, required=True, help="model directory (HF layout)")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--filler", default="grammar",
                         help="'grammar' (built-in sentences) or a plain-text file of sentences")
        sub.add_argument("--ids-out", type=Path,
                         help="also write the ids as an lmc --prompt/--text file")
        sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.workloads import decode_prompt, needle_prompt, ppl_tokens

    if not args.model.is_dir():
        raise InputError(f"--model {args.model}: not a directory")
    if args.ids_out and not args.ids_out.parent.is_dir():
        raise InputError(f"--ids-out {args.ids_out}: directory {args.ids_out.parent} does not "
                         "exist")
    if args.kind == "needle":
        record = needle_prompt(args.model, args.ctx, args.depth, args.seed, filler=args.filler)
    elif args.kind == "ppl":
        record = ppl_tokens(args.model, args.length, args.seed, filler=args.filler,
                            text=args.text)
    else:
        record = decode_prompt(args.model, args.ctx, args.seed, filler=args.filler)
    if args.ids_out:
        try:
            args.ids_out.write_text(" ".join(map(str, record.ids)) + "\n")
        except OSError as exc:
            raise RunFailure(f"--ids-out {args.ids_out}: cannot write the ids: "
                             f"{exc.strerror or exc}") from exc
    print(json.dumps(record.to_dict()))
    return 0
