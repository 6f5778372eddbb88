"""``lmc``, this project's engine, behind the adapter interface (harness.engines.base).

Its spec section is ``[engine]`` (``section.py``), crossed into ``EngineConfig`` records
(``config.py``) and turned into lmc's options of a run (``run_options.py``); it is built with
ninja per target and git revision (``build.py``); the model is a Hugging Face directory pushed
as a tree, the token ids travel on standard input, and the output is the one JSON document of
the engine contract (engine/README.md), checked on the board's side (``output.py``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.lmc_axes import NAME
from db.records import CPU_FIGURES, Figures, Outcome
from devices import isa
from devices.checker import Checker
from devices.files import read_json
from devices.transport import Transport
from harness.contract import WorkOrder
from harness.engines.base import (
    BuildFn,
    BuildRecord,
    PlannedWork,
    Prepared,
    Rerun,
    Spec,
    StoredRun,
)
from harness.engines.lmc import output
from harness.engines.lmc.build import SOURCE_PATHS, build_engine, build_identity
from harness.engines.lmc.config import COLUMNS, TIMING_COLUMNS, EngineConfig, configs, count
from harness.engines.lmc.memory import resident_bytes, text_config
from harness.engines.lmc.run_options import options
from harness.engines.lmc.section import SECTION, EngineAxes, parse_section
from harness.errors import InputError, RunFailure
from harness.identity import DIRTY, WORKTREE, Catalogue, git_output, model_identity, sha256_file
from harness.workloads.base import Material, WorkloadKind
from harness.workloads.grid import GenerateFn
from harness.workloads.kinds import WorkloadPoint

PREDICTOR_FLAG = "--predictor"  # gbm's trees, pushed by hash and named on the board
# the engine's --measure-selection figures, under the outcome's field names
SELECTION_FIELDS = {"mass": "selection_mass", "oracle_recall": "oracle_recall",
                    "max_abs_diff": "max_abs_diff", "bytes_read": "bytes_read"}

__all__ = ["NAME", "EngineConfig", "LmcAdapter", "check_revisions", "generator", "options",
           "run_here"]

# `reproduce`: the timing compared per command, where it is stored (the run's column or the
# outcome's) and its key in lmc's document (None: the engine process's wall time)
RERUN_TIMINGS = {"generate": ("decode_ms_per_token", "run", "decode_ms_per_token"),
                 "ppl": ("engine_ms", "run", None),
                 "attn-bench": ("attn_median_ms", "outcome", "ms")}


@dataclass(frozen=True)
class Inputs:
    """What lmc's work orders name besides the build: the model and gbm's trees."""

    model_dir: Path | None
    model_sha: str | None  # its weights' identity (run keys, the models table)
    model_tree: str | None  # its folder's manifest hash (what the boards cache)
    predictors: dict[str, Path]  # gbm tree file sha256 -> path


def revision_arg(revision: str | None) -> str | None:
    """A spec revision as the build takes it: None for the working tree."""
    return None if revision == WORKTREE else revision


def check_revisions(spec: Spec) -> None:
    """Every revision the spec names is a commit of this repository (or the working tree)."""
    for revision in spec.revisions:
        if revision == WORKTREE:
            continue
        try:
            git_output("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        except InputError:
            raise InputError(f"{spec.path}: key 'revisions': {revision!r} is not a git revision "
                             f"of this repository (or use {WORKTREE!r} for the working tree)"
                             ) from None


def run_here(binary: str | Path | Sequence[str], command: str, model: str | Path | None,
             ids: Sequence[int] | None, flags: Sequence[str] = (),
             timeout: float | None = 900) -> dict[str, Any]:
    """Run lmc on this machine, as the farm runs it (argv and checked output from the adapter),
    for benches and studies that need no board: ``binary`` is its path or an argv prefix ending
    with it (an emulator, then the binary); the ids go to standard input. Returns the engine's
    document; RunFailure names the command when it fails or prints no valid document."""
    prefix = [str(binary)] if isinstance(binary, (str, Path)) else [str(x) for x in binary]
    adapter = LmcAdapter()
    argv = [*prefix[:-1], *adapter.argv(command, prefix[-1], None if model is None else str(model),
                                        ids is not None, flags)]
    stdin = None if ids is None else " ".join(map(str, ids)) + "\n"
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    shown = shlex.join(argv[len(prefix) - 1:])
    if done.returncode != 0:
        raise RunFailure(f"`{shown}` failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[:500]}")
    try:
        return adapter.parse(done.stdout, command)
    except output.EngineOutputError as exc:
        raise RunFailure(f"`{shown}`: {exc}") from exc


def generator(lmc: str | Path | list[str], model_dir: str | Path,
              extra_args: Sequence[str] = (), timeout: float = 600) -> GenerateFn:
    """Greedy generation by the lmc binary (or argv prefix, e.g. under an emulator), as a
    needle grid's generate function (harness.workloads.grid)."""

    def generate(ids: list[int], max_new: int, stop_id: int) -> list[int]:
        options = ["--max-new", str(max_new), "--stop", str(stop_id), *extra_args]
        doc = run_here(lmc, "generate", model_dir, ids, options, timeout)
        return [int(t) for t in doc["tokens"]]

    return generate


class LmcAdapter:
    """lmc, this project's engine, behind the harness (base.EngineAdapter)."""

    name = NAME
    section = SECTION
    source_paths = SOURCE_PATHS
    axis_columns = COLUMNS
    timing_columns = TIMING_COLUMNS
    reproducible = True

    def default_revisions(self) -> list[str]:
        return [WORKTREE]  # the working tree's engine

    # -- the spec and the matrix ---------------------------------------------------------------

    def parse_section(self, check: Checker, value: Any, spec_dir: Path,
                      kinds: list[str]) -> EngineAxes:
        return parse_section(check, value, kinds)

    def runs_kind(self, kind: WorkloadKind) -> bool:
        return True

    def revisions(self, spec: Spec) -> list[str]:
        return list(spec.revisions)

    def threads_key(self, axes: EngineAxes) -> str | None:
        return "engine.threads" if axes.threads is None else None

    def configs(self, axes: EngineAxes, kind: WorkloadKind,
                default_threads: int) -> list[EngineConfig]:
        return configs(axes, kind.command, kind.uses_model, default_threads)

    def count_configs(self, axes: EngineAxes, kind: WorkloadKind, default_threads: int) -> int:
        return count(axes, kind.uses_model)

    # -- planning ------------------------------------------------------------------------------

    def prepare(self, spec: Spec, axes: EngineAxes, archs: list[str],
                build: BuildFn) -> Prepared:
        check_revisions(spec)
        builds = build(self.name, [(rev, arch) for rev in spec.revisions for arch in archs])
        return self._prepared(spec, axes, builds)

    def identities(self, spec: Spec, axes: EngineAxes, archs: list[str]) -> Prepared:
        check_revisions(spec)
        builds = {(rev, arch): build_identity(arch, revision_arg(rev))
                  for rev in spec.revisions for arch in archs}
        return self._prepared(spec, axes, builds)

    def _prepared(self, spec: Spec, axes: EngineAxes,
                  builds: dict[tuple[str, str], BuildRecord]) -> Prepared:
        catalogue = Catalogue.empty()
        models: dict[str, tuple[Path, dict[str, Any]]] = {}
        model_sha, model_tree = None, None
        if spec.model is not None:
            model_sha, config = model_identity(spec.model)
            models[model_sha] = (spec.model, config)
            model_tree = catalogue.add_tree(spec.model)
        predictors = {p.predictor.sha256: p.predictor.path for p in axes.policies
                      if p.predictor is not None}
        for sha, path in predictors.items():
            catalogue.add_file(path, sha)
        return Prepared(builds, models, catalogue,
                        Inputs(spec.model, model_sha, model_tree, predictors))

    def work(self, point: WorkloadPoint, config: EngineConfig, record: BuildRecord,
             prepared: Prepared, material: Material, timeout_s: float) -> PlannedWork:
        inputs: Inputs = prepared.inputs
        reads_model = point.workload_kind.uses_model and inputs.model_dir is not None
        predictor = None if config.predictor is None else inputs.predictors[config.predictor]
        order = WorkOrder(
            run_key="", label=f"{point.label()} {config.label()}", engine=self.name,
            command=point.command,
            binary=record.binary, binary_sha256=record.binary_sha256,
            model_dir=str(inputs.model_dir) if reads_model else None,
            model_sha256=inputs.model_tree if reads_model else None,
            ids=material.ids, options=options(point, config, material.stop_id),
            timeout_s=timeout_s,
            extra_file=None if predictor is None else str(predictor),
            extra_sha256=config.predictor,
            extra_flag=None if predictor is None else PREDICTOR_FLAG,
        )
        return PlannedWork(order, key_model=inputs.model_sha,
                           model_sha=inputs.model_sha if point.workload_kind.uses_model
                           else None,
                           stored={} if predictor is None else {"predictor_file": str(predictor)})

    # -- a run -----------------------------------------------------------------------------------

    def build(self, target: str, revision: str | None) -> BuildRecord:
        return build_engine(target=target, rev=revision_arg(revision))

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             flags: Sequence[str]) -> list[str]:
        argv = [binary, command]
        if model is not None:
            argv += ["--model", model]
        if stdin_ids:  # `-`: the ids arrive on standard input
            argv += ["--text" if command == "ppl" else "--prompt", "-"]
        return argv + list(flags)

    def parse(self, stdout: str, command: str) -> Any:
        return output.parse(stdout, command)  # the lmc/1 schema, checked

    def collect(self, transport: Transport, order: WorkOrder, data: Any) -> None:
        trace = output.trace_path(order.options)
        if trace is not None:
            data[output.TRACE_KEY] = output.fetch_trace(transport, trace)

    def figures(self, command: str, data: Any) -> Figures:
        return Figures(
            prefill_ms=data.get("prefill_ms"),
            decode_ms_per_token=data.get("decode_ms_per_token"),
            attn_ms_per_token=data.get("attn_ms_per_token"),
            prompt_tokens=data.get("prompt_tokens"),
            steps=list(data.get("steps", [])) if command == "generate" else [],
            extra={key: data[key] for key in CPU_FIGURES.values() if key in data},
        )

    def outcome(self, command: str, data: Any, figures: Figures) -> Outcome:
        found = Outcome(extra=figures.extra)
        if command == "generate":
            found.generated_ids = [int(t) for t in data.get("tokens", [])]
        elif command == "ppl":
            found.nll, found.ppl = data.get("nll"), data.get("ppl")
            if "key_ranking" in data:  # --measure-keys
                found.extra["key_ranking"] = data["key_ranking"]
        elif command == "attn-bench":
            found.attn_median_ms = data.get("ms")
        if command in ("generate", "attn-bench"):
            selection = data.get("selection") or {}
            for key, name in SELECTION_FIELDS.items():
                if key in selection:
                    value = selection[key]
                    setattr(found, name, int(value) if name == "bytes_read" else value)
        if output.TRACE_KEY in data:
            found.extra[output.TRACE_KEY] = data[output.TRACE_KEY]
        memory = data.get("kv_memory")
        if memory is not None:  # the columns; the rest (paged, live bytes) kept in extra
            found.kv_allocated_bytes = memory["allocated_bytes"]
            found.kv_resident_bytes = memory["resident_bytes"]
            found.extra["kv_memory"] = memory
        found.peak_rss_kb = data.get("peak_rss_kb")
        return found

    def rebuild(self, build: dict[str, Any]) -> BuildRecord:
        revision = str(build["revision"])
        # a build of uncommitted sources can only come back from the working tree as it is
        rev = None if revision.endswith(DIRTY) or revision == WORKTREE else revision
        return build_engine(target=stored_target(build), rev=rev, variant=build["variant"],
                            toolchain_name=build["toolchain"])

    def rerun(self, stored: StoredRun, timeout_s: float) -> Rerun:
        row = stored.row
        config = row["config"]
        predictor, predictor_sha = _stored_predictor(config)
        command = row["command"]
        order = WorkOrder(
            run_key=f"{row['run_key']}-reproduce", label=f"reproduce run {row['id']}",
            engine=self.name, command=command, binary=str(stored.binary),
            binary_sha256=stored.binary_sha256, model_dir=stored.model_dir,
            model_sha256=stored.model_dir and Catalogue.empty().add_tree(Path(stored.model_dir)),
            ids=None if command == "attn-bench" else stored.ids,
            options=tuple(config["argv_options"]),
            timeout_s=timeout_s, extra_file=predictor, extra_sha256=predictor_sha,
            extra_flag=PREDICTOR_FLAG if predictor else None)
        metric, stored_in, document_key = RERUN_TIMINGS[command]
        original = (row if stored_in == "run" else stored.outcome or {}).get(metric)

        def timing(data: dict[str, Any], engine_ms: float | None) -> float | None:
            return engine_ms if document_key is None else data.get(document_key)

        return Rerun(order, metric, original,
                     same=lambda data: _same_output(command, stored.outcome, data),
                     timing=timing)

    def health_argv(self, binary: str) -> list[str]:
        return [binary, "info"]

    def resident_weights(self, spec: Spec, axes: EngineAxes) -> dict[str, int]:
        if spec.model is None:
            return {}
        try:
            config = text_config(read_json(spec.model / "config.json"))
            return {f"wq {wq}": resident_bytes(config, wq) for wq in axes.wq}
        except (KeyError, TypeError, ValueError, OSError):
            return {}  # harness.plan.inputs and the engine name what is wrong with config.json

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


def stored_target(build: dict[str, Any]) -> str:
    """The build target (``arch:level``) of a stored build row: its ``isa``, or for a row from
    before the levels, the level whose flags its cflags hold (x86-64-v3's were every x86
    build's; aarch64's -mcpu=cortex-a76 was the dot-product level)."""
    arch = str(build["target"])
    if build.get("isa"):
        return f"{arch}:{build['isa']}"
    cflags = set(build.get("cflags") or [])
    for level in isa.LEVELS.get(arch, ()):
        if set(level.cflags) <= cflags:
            return f"{arch}:{level.name}"
    return f"{arch}:{isa.FALLBACK[arch]}" if arch in isa.FALLBACK else arch


def _stored_predictor(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """gbm's tree file as the stored run used it (path, sha256), or (None, None) without one."""
    sha = config.get("predictor")
    if sha is None:
        return None, None
    path = Path(config.get("predictor_file") or "")
    if not path.is_file() or sha256_file(path) != sha:
        raise RunFailure(f"predictor {path}: the run used trees with sha256 {sha}, and that "
                         "file is gone or changed; restore it to reproduce the run")
    return str(path), sha


def _same_output(command: str, original: dict[str, Any] | None,
                 data: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether a rerun's output is the stored one's: generated tokens (and the first step where
    they part), the nll of a ppl run; None for attn-bench, which has none to compare."""
    from reports.runs import first_divergence  # pandas: not for every user of the adapter

    original = original or {}
    if command == "generate":
        before = [int(t) for t in original.get("generated_ids") or []]
        now = [int(t) for t in data.get("tokens", [])]
        step = first_divergence(before, now)
        return step is None, "" if step is None else f"first divergent step {step}"
    if command == "ppl":
        same = original.get("nll") == data.get("nll")
        return same, "" if same else f"nll {original.get('nll')} -> {data.get('nll')}"
    return None, ""
