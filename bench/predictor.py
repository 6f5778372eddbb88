"""Decode cost of the eviction-prediction article's policies: exact vs h2o vs h2o-prev vs gbm (with
and without --kv-budget), on a model and a predictor file from `benchfarm predictor study`.

Every round runs each configuration once, in turn (so drift of a shared machine hits all of
them alike), as `lmc generate` over one needle prompt; the figure per configuration is the
median over rounds of the run's median decode ms per token, and its ratio to exact.

    .venv/bin/python bench/predictor.py \
        --predictor out/reports/predictor-study/predictor-cascade.gbm
    .venv/bin/python bench/predictor.py --predictor FILE --model DIR --ctx 1024 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engines.lmc import run_here  # noqa: E402
from harness.engines.lmc.build import build_engine  # noqa: E402
from harness.errors import RunFailure  # noqa: E402
from harness.workloads import needle_prompt  # noqa: E402


def configs(predictor: str, k: int, budget: int) -> dict[str, list[str]]:
    gbm = ["--attn", "gbm", "--predictor", predictor]
    return {
        "exact": [],
        f"h2o k={k}": ["--attn", "h2o", "--k", str(k)],
        f"h2o-prev k={k}": ["--attn", "h2o-prev", "--k", str(k)],
        f"gbm k={k}": [*gbm, "--k", str(k)],
        f"gbm kv-budget={budget}": [*gbm, "--kv-budget", str(budget)],
    }


def decode_ms(binary: str, model: Path, prompt: list[int], args: argparse.Namespace,
              extra: list[str]) -> float:
    options = ["--max-new", str(args.decode), "--block", str(args.block), "--threads",
               str(args.threads), *extra]
    try:
        return run_here(binary, "generate", model, prompt, options)["decode_ms_per_token"]
    except RunFailure as exc:
        sys.exit(str(exc))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expects a positive integer, got {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictor", required=True, help="an lmc-gbm file for the model")
    parser.add_argument("--model", type=Path, default=Path("models/needle-tiny"))
    parser.add_argument("--ctx", type=positive, default=512)
    parser.add_argument("--block", type=positive, default=16)
    parser.add_argument("--decode", type=positive, default=32, help="tokens per run")
    parser.add_argument("--rounds", type=positive, default=5)
    parser.add_argument("--threads", type=positive, default=1)
    args = parser.parse_args()
    binary = build_engine().binary
    blocks = (args.ctx + args.decode + args.block - 1) // args.block
    k = max(1, blocks // 4)  # a 25 % budget
    table = configs(args.predictor, k, k * args.block)
    times: dict[str, list[float]] = {name: [] for name in table}
    prompt = list(needle_prompt(args.model, args.ctx, 0.5, 0).ids)
    for _ in range(args.rounds):
        for name, extra in table.items():
            times[name].append(decode_ms(binary, args.model, prompt, args, extra))
    exact = statistics.median(times["exact"])
    print(f"model {args.model.name}, ctx {args.ctx}, block {args.block}, {args.rounds} rounds, "
          f"{args.threads} thread(s)")
    print(f"{'config':<24} {'decode ms/token':>16} {'ratio to exact':>15}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<24} {med:16.3f} {med / exact:15.2f}")


if __name__ == "__main__":
    main()
