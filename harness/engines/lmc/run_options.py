"""lmc's options of one run: the one place that turns a workload point and lmc's config into
lmc's flags."""

from __future__ import annotations

from db.lmc_axes import SWITCHES
from harness.engines.lmc.config import EngineConfig
from harness.engines.lmc.output import TRACE_FILE, TRACE_FLAG
from harness.workloads.kinds import WorkloadPoint

ATTN_BENCH_FLAGS = (("--ctx", "ctx"), ("--heads", "heads"), ("--kv-heads", "kv_heads"),
                    ("--head-dim", "head_dim"), ("--runs", "runs"), ("--seed", "seed"))


def options(workload: WorkloadPoint, config: EngineConfig,
            stop_id: int | None = None) -> tuple[str, ...]:
    """The `lmc` flags of one run (without --model/--prompt/--text, which are device paths)."""
    opts: list[str] = ["--attn", config.policy]
    for flag, value in (("--k", config.k), ("--block", config.block),
                        ("--probes", config.probes), ("--kv-budget", config.kv_budget),
                        ("--measure-keys", config.measure_keys),
                        ("--measure-keys-keep", config.measure_keys_keep),
                        ("--measure-keys-direct", config.measure_keys_direct)):
        if value is not None:
            opts += [flag, str(value)]
    opts += ["--threads", str(config.threads), "--kv", str(config.kv)]
    if config.measure_selection:
        opts.append("--measure-selection")
    if config.trace_selection:
        opts += [TRACE_FLAG, TRACE_FILE]
    opts += [s.flag for s in SWITCHES if config.switch(s.name) is not None]
    if workload.command == "attn-bench":
        params = dict(workload.params)
        for flag, name in ATTN_BENCH_FLAGS:
            opts += [flag, str(params[name])]
        if "layers" in params:  # optional: absent, lmc attends one layer
            opts += ["--layers", str(params["layers"])]
        return tuple(opts)
    opts += ["--wq", str(config.wq), "--prefill-attn", str(config.prefill_attn)]
    if config.bf16_acts:
        opts.append("--bf16-acts")
    if workload.command == "generate":
        opts += ["--max-new", str(workload.get("max_new"))]
        if stop_id is not None:
            opts += ["--stop", str(stop_id)]
    return tuple(opts)
