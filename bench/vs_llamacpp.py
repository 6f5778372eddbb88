"""lmc against llama.cpp's llama-bench, through the farm: a thin wrapper over a spec.

Runs ``specs/lmc_vs_llamacpp.toml`` (or the spec given with ``--spec``, e.g. one at another
prompt depth) exactly as ``benchfarm run`` does: both engines are built, the model converted to
GGUF for llama-bench, every run stored with its run key (stored ok runs are reused unless
``--force``). Then it prints, from the store, each node's figures side by side: per lmc policy,
weight format and thread count the median of lmc and of llama-bench, and the ratio llama-bench /
lmc (above 1: lmc is faster), for decode ms/token and prefill ms. The same comparison is
``benchfarm compare lmc llama-bench --experiment NAME [--lmc-policy P]``.

    benchfarm farm up                                   # the local farm (x86 + emulated arm)
    .venv/bin/python bench/vs_llamacpp.py [--spec FILE] [--devices x86] [--db URL]

What the two sides time differs where the spec says so (llama-bench's tg test decodes from a
context of ``depth`` tokens, 0 by default; lmc's steps follow its prompt): see the spec's
comments and harness/engines/README.md. Emulated nodes' figures are qemu's, not a board's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from db.store import Store  # noqa: E402
from devices.inventory import load_inventory  # noqa: E402
from harness.commands.arguments import device_list  # noqa: E402
from harness.engines.llamabench import NAME as LLAMA_BENCH  # noqa: E402
from harness.engines.lmc import NAME as LMC  # noqa: E402
from harness.errors import InputError  # noqa: E402
from harness.execution.coordinator import RunRequest, run_experiment  # noqa: E402
from harness.spec import load_spec  # noqa: E402
from reports.compare import compare_runs, load_runs  # noqa: E402

DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "specs" / "lmc_vs_llamacpp.toml"
METRICS = {"decode_ms_per_token": "decode ms/token", "prefill_ms": "prefill ms"}


def side_by_side(store: Store, experiment: str) -> pd.DataFrame:
    """One row per (node, workload point, lmc policy, weights and threads, metric): both
    medians, the ratio llama-bench / lmc and the runs behind each. Each of lmc's policies in the
    experiment (exact, sparse ...) is set against the same llama-bench runs."""
    runs = load_runs(store, [experiment])
    policies = sorted(set(runs.loc[runs["engine"] == LMC, "policy"].dropna()))
    frames = []
    for policy in policies:
        for metric, label in METRICS.items():
            table = compare_runs(runs, LMC, LLAMA_BENCH, metric, lmc_policy=policy).table
            if len(table):
                frames.append(table.assign(metric=label, policy=policy))
    if not frames:
        return pd.DataFrame()
    rows = pd.concat(frames, ignore_index=True)
    keep = [c for c in ("device", "ctx", "max_new", "policy", "config", "metric", "n_a",
                        "median_a", "n_b", "median_b", "ratio") if c in rows.columns]
    return rows[keep].rename(columns={"config": "weights threads", "policy": "lmc policy",
                                      "n_a": "lmc runs", "median_a": "lmc",
                                      "n_b": "llama-bench runs", "median_b": "llama-bench",
                                      "ratio": "ratio llama-bench/lmc"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC,
                        help="a spec that runs both engines (default: %(default)s)")
    parser.add_argument("--devices", type=device_list, action="extend",
                        help="device names or classes, comma-separated (default: the spec's)")
    parser.add_argument("--inventory", help="inventory TOML (default: as for `benchfarm run`)")
    parser.add_argument("--db", default=os.environ.get("BENCHFARM_DB", "sqlite:///benchfarm.db"))
    parser.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    parser.add_argument("--force", action="store_true", help="run again what is stored as ok")
    args = parser.parse_args(argv)

    try:
        spec = load_spec(args.spec)
        if set(spec.engines) != {LMC, LLAMA_BENCH}:
            raise InputError(f"{args.spec}: key 'engines' must name both {LMC!r} and "
                             f"{LLAMA_BENCH!r} (it names {', '.join(spec.engines)})")
        with Store.open(args.db) as store:
            summary = run_experiment(RunRequest(spec, load_inventory(args.inventory),
                                                args.devices, args.force, args.ray_address),
                                     store)
            print(summary.line())
            table = side_by_side(store, spec.name)
    except Exception as exc:  # noqa: BLE001 - the harness's errors carry their exit code
        code = getattr(type(exc), "exit_code", None)
        if code is None:
            raise
        print(f"vs_llamacpp: error: {exc}", file=sys.stderr)
        return int(code)
    if not len(table):
        print(f"no runs of both engines on a common node and shape in {spec.name!r} yet")
        return 1
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 200):
        print(table.to_string(index=False))
    return 0 if summary.complete else 1


if __name__ == "__main__":
    sys.exit(main())
