"""``lmc``, this project's engine, behind the adapter interface.

Builds go through :func:`harness.build.build_engine` (ninja, per target and git revision); the
model is a Hugging Face directory pushed as a tree; token ids travel on standard input; the
output is the one JSON document of the engine contract (engine/README.md). ``options`` is the
one place that turns a workload point and lmc's config into its flags.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import engine_output
from harness.build import BuildRecord, build_engine
from harness.engines.base import Measurements
from harness.errors import RunFailure

if TYPE_CHECKING:  # harness.matrix imports the engines: only the types are needed here
    from harness.matrix import EngineConfig, WorkloadPoint

NAME = "lmc"
# The engine switches a config may set away from the engine's defaults, and their flags.
SWITCH_FLAGS = {"importance": "--no-importance", "recency": "--no-recency",
                "probe_summary": "--probe-summary", "ref_attn": "--ref-attn"}
ATTN_BENCH_FLAGS = (("--ctx", "ctx"), ("--heads", "heads"), ("--kv-heads", "kv_heads"),
                    ("--head-dim", "head_dim"), ("--runs", "runs"), ("--seed", "seed"))


def options(workload: WorkloadPoint, config: EngineConfig,
            stop_id: int | None = None) -> tuple[str, ...]:
    """The `lmc` flags of one run (without --model/--prompt/--text, which are device paths)."""
    opts: list[str] = ["--attn", config.policy]
    for flag, value in (("--k", config.k), ("--block", config.block),
                        ("--probes", config.probes), ("--kv-budget", config.kv_budget),
                        ("--measure-keys", config.measure_keys)):
        if value is not None:
            opts += [flag, str(value)]
    opts += ["--threads", str(config.threads), "--kv", str(config.kv)]
    if config.measure_selection:
        opts.append("--measure-selection")
    if config.trace_selection:
        opts += [engine_output.TRACE_FLAG, engine_output.TRACE_FILE]
    opts += [flag for name, flag in SWITCH_FLAGS.items() if getattr(config, name) is not None]
    if workload.kind == "attn-bench":
        params = dict(workload.params)
        for flag, name in ATTN_BENCH_FLAGS:
            opts += [flag, str(params[name])]
        if "layers" in params:  # optional: absent, lmc attends one layer
            opts += ["--layers", str(params["layers"])]
        return tuple(opts)
    opts += ["--wq", str(config.wq), "--prefill-attn", str(config.prefill_attn)]
    if workload.command == "generate":
        opts += ["--max-new", str(workload.get("max_new"))]
        if stop_id is not None:
            opts += ["--stop", str(stop_id)]
    return tuple(opts)


def run_here(binary: str | Path | Sequence[str], command: str, model: str | Path | None,
             ids: Sequence[int] | None, options: Sequence[str] = (),
             timeout: float | None = 900) -> dict[str, Any]:
    """Run lmc on this machine, as the farm runs it (argv and checked output from the adapter),
    for benches and studies that need no board: ``binary`` is its path or an argv prefix ending
    with it (an emulator, then the binary); the ids go to standard input. Returns the engine's
    document; RunFailure names the command when it fails or prints no valid document."""
    prefix = [str(binary)] if isinstance(binary, (str, Path)) else [str(x) for x in binary]
    engine = LmcEngine()
    argv = [*prefix[:-1], *engine.argv(command, prefix[-1], None if model is None else str(model),
                                       ids is not None, options)]
    stdin = None if ids is None else " ".join(map(str, ids)) + "\n"
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    shown = shlex.join(argv[len(prefix) - 1:])
    if done.returncode != 0:
        raise RunFailure(f"`{shown}` failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[:500]}")
    try:
        return engine.parse(done.stdout, command)
    except engine_output.EngineOutputError as exc:
        raise RunFailure(f"`{shown}`: {exc}") from exc


class LmcEngine:
    name = NAME

    def build(self, target: str, revision: str | None) -> BuildRecord:
        return build_engine(target=target, rev=revision)

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Sequence[str]) -> list[str]:
        argv = [binary, command]
        if model is not None:
            argv += ["--model", model]
        if stdin_ids:  # `-`: the ids arrive on standard input
            argv += ["--text" if command == "ppl" else "--prompt", "-"]
        return argv + list(options)

    def parse(self, stdout: str, command: str) -> Any:
        return engine_output.parse(stdout, command)  # the lmc/1 schema, checked

    def measurements(self, command: str, data: Any) -> Measurements:
        return Measurements(
            prefill_ms=data.get("prefill_ms"),
            decode_ms_per_token=data.get("decode_ms_per_token"),
            attn_ms_per_token=data.get("attn_ms_per_token"),
            prompt_tokens=data.get("prompt_tokens"),
            steps=list(data.get("steps", [])) if command == "generate" else [],
        )

    def health_argv(self, binary: str) -> list[str]:
        return [binary, "info"]

    def health_verdict(self, stdout: str, stderr: str, arch: str) -> tuple[bool, str]:
        """``lmc info`` must print its JSON and, where it names one, the device's arch."""
        try:
            info = json.loads(stdout)
        except json.JSONDecodeError:
            return False, f"printed no JSON: {stdout[:120]!r}"
        if not isinstance(info, dict):
            return False, f"printed no JSON object: {stdout[:120]!r}"
        simd = info.get("simd")
        simd_text = ", ".join(map(str, simd)) if isinstance(simd, list) else str(simd)
        return info.get("arch") in (None, arch), (f"version {info.get('version')}, arch "
                                                  f"{info.get('arch')}, simd [{simd_text}]")
