"""`benchfarm predictor train`: seed 004's attention predictor on a model, end to end.

Dumps key features from exact ``lmc ppl`` runs over needle prompts (train and held-out test
texts), trains every feature set per layer, evaluates them and the baselines on the test texts,
and writes OUT/predictor-<set>.gbm (for ``lmc --attn gbm --predictor``) and OUT/metrics.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.build import build_engine
from harness.errors import InputError
from harness.predictor.dump import KeyDump, concat, run_dump
from harness.predictor.train import (
    BASELINES,
    FEATURE_SETS,
    Evaluation,
    baseline_scores,
    evaluate,
    train,
    write_predictor,
)
from harness.workloads import needle_prompt


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("predictor", help="train and evaluate the attention predictor")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    tr = actions.add_parser("train", help="dump features, train per layer, evaluate, export")
    tr.add_argument("--model", type=Path, required=True, help="model directory (HF layout)")
    tr.add_argument("--out", type=Path, required=True,
                    help="directory for the .gbm files and metrics.json")
    tr.add_argument("--lmc", help="lmc binary (default: build it for this machine)")
    tr.add_argument("--ctx", type=_positive, default=512, help="tokens per text (default 512)")
    tr.add_argument("--train-texts", type=_positive, default=4)
    tr.add_argument("--test-texts", type=_positive, default=2)
    tr.add_argument("--every", type=_positive, default=4, help="dump every N-th query position")
    tr.add_argument("--sets", nargs="+", default=list(FEATURE_SETS), choices=FEATURE_SETS)
    tr.add_argument("--max-iter", type=_positive, default=100, help="boosting rounds per layer")
    tr.set_defaults(func=run)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expects a positive integer, got {text!r}")
    return value


def texts(model: Path, lmc: list[str], ctx: int, first: int, count: int, every: int) -> KeyDump:
    """Dumps of needle prompts with seeds first .. first+count-1 (depths spread over [0, 1])."""
    dumps = []
    for seed in range(first, first + count):
        ids = needle_prompt(model, ctx, (seed % 5) / 4, seed).ids
        dumps.append(run_dump(lmc, model, ids, every, text=seed))
    return concat(dumps)


def format_table(result: Evaluation) -> str:
    lines = [f"{'scorer':<10} {'layer':>5} {'rho':>7} {'rec32':>7} {'mass32':>7} {'lost50':>7}"]
    for name, overall in result.overall.items():
        rows = [("all", overall), *((str(i), s) for i, s in enumerate(result.per_layer[name]))]
        for label, s in rows:
            lines.append(f"{name:<10} {label:>5} {s.rho:7.3f} {s.recall32:7.3f} "
                         f"{s.captured32:7.3f} {s.lost50:7.3f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not (args.model / "config.json").is_file():
        raise InputError(f"--model {args.model}: no config.json there")
    lmc = [args.lmc] if args.lmc else [build_engine().binary]
    train_dump = texts(args.model, lmc, args.ctx, 0, args.train_texts, args.every)
    test_dump = texts(args.model, lmc, args.ctx, args.train_texts, args.test_texts, args.every)
    scorers = {}
    files = {}
    for feature_set in args.sets:
        models = train(train_dump, feature_set, max_iter=args.max_iter)
        scorers[feature_set] = models.predict(test_dump)
        path = write_predictor(models, args.out / f"predictor-{feature_set}.gbm")
        files[feature_set] = str(path)
    for name in BASELINES:
        scorers[name] = baseline_scores(test_dump, name)
    result = evaluate(test_dump, scorers)
    report = {"model": str(args.model), "ctx": args.ctx, "train_texts": args.train_texts,
              "test_texts": args.test_texts, "every": args.every,
              "train_rows": len(train_dump.rows), "test_rows": len(test_dump.rows),
              "predictors": files, "metrics": result.to_dict()}
    (args.out / "metrics.json").write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(result))
    print(f"wrote {args.out / 'metrics.json'} and {len(files)} predictor files")
    return 0
