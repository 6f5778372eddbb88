"""llama.cpp's ``llama-bench`` as the second engine on the farm.

A run is one ``llama-bench -o json`` invocation on a board: a ``decode`` workload point
(``ctx`` prompt tokens, ``max_new`` generated tokens) becomes the tests ``pp<ctx>`` and
``tg<max_new>`` (and ``pp<ctx>+tg<max_new>`` with ``pg = true``), each repeated
``repetitions`` times inside the process after llama-bench's own warm-up. Every repetition's
``samples_ns`` and the build facts llama-bench prints (build_commit, build_number, cpu_info,
backends ...) are kept verbatim in the run's outcome; ``prefill_ms`` is the pp test's mean and
``decode_ms_per_token`` the tg test's mean divided by its tokens, so that reports put the runs
beside lmc's.

Note what the tests time: ``tg`` generates from a context of ``depth`` tokens (0 by default,
llama-bench's convention and that of the published tables), whereas an lmc decode run's steps
follow its ``ctx``-token prompt; set ``depth`` to the ctx to time llama.cpp's decode there.

The model is GGUF: the spec's Hugging Face model converted by :mod:`harness.engines.llamabench.gguf`
(cached under ``build/gguf``, identified by the GGUF file's sha256) or a GGUF file named in the
``[llama-bench]`` section.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from db.records import Figures, Outcome
from devices.checker import Checker
from devices.transport import Transport
from harness import REPO_ROOT
from harness.contract import WorkOrder
from harness.engines.base import (
    Artifact,
    BuildFn,
    BuildRecord,
    NeedsBuild,
    PlannedWork,
    Prepared,
    Rerun,
    Spec,
    StoredRun,
)
from harness.engines.llamabench.build import PYPI, build_llama_bench
from harness.engines.llamabench.section import (
    COLUMNS,
    NAME,
    SECTION,
    LlamaBenchAxes,
    LlamaBenchConfig,
    parse_section,
)
from harness.errors import InputError
from harness.identity import WORKTREE, Catalogue, sha256_file
from harness.workloads.base import Material, WorkloadKind
from harness.workloads.kinds import WorkloadPoint

# The fields of a llama-bench JSON row that describe the build and machine, not the test.
BUILD_FIELDS = ("build_commit", "build_number", "cpu_info", "gpu_info", "backends")
RUNS_KINDS = ("decode",)  # a decode point: pp<ctx> and tg<max_new>

__all__ = ["BUILD_FIELDS", "NAME", "LlamaBenchConfig", "LlamaBenchAdapter", "bench_test_name",
           "options"]


def bench_test_name(row: dict[str, Any]) -> str:
    """llama-bench's own names: pp512, tg128, pp512+tg128; ``@d<n>`` at a depth."""
    n_prompt, n_gen, depth = (int(row.get(k) or 0) for k in ("n_prompt", "n_gen", "n_depth"))
    parts = ([f"pp{n_prompt}"] if n_prompt else []) + ([f"tg{n_gen}"] if n_gen else [])
    return "+".join(parts) + (f" @ d{depth}" if depth else "")


def options(ctx: int, max_new: int, config: LlamaBenchConfig) -> tuple[str, ...]:
    """llama-bench's flags for one decode workload point (without -m, a device path)."""
    opts = ["-p", str(ctx), "-n", str(max_new), "-d", str(config.depth),
            "-r", str(config.repetitions), "-t", str(config.threads),
            "-ctk", config.cache_type, "-ctv", config.cache_type, "-o", "json"]
    if config.pg:
        opts += ["-pg", f"{ctx},{max_new}"]
    return tuple(opts)


class LlamaBenchAdapter:
    name = NAME
    section = SECTION
    source_paths = ()  # built from llama.cpp's own source (the section's source and rev)
    axis_columns = COLUMNS
    timing_columns = ()  # its runs differ in their command and size only
    reproducible = False

    def default_revisions(self) -> list[str]:
        # its runs cross their own source's revision, not the spec's: a spec of llama-bench
        # alone keeps the working tree as its revisions, which nothing reads
        return [WORKTREE]

    def __init__(self, source: str = PYPI, rev: str | None = None,
                 gguf_dir: Path | None = None) -> None:
        self.source, self.rev = source, rev
        self.gguf_dir = gguf_dir or REPO_ROOT / "build" / "gguf"

    # -- the spec and the matrix ---------------------------------------------------------------

    def parse_section(self, check: Checker, value: Any, spec_dir: Path,
                      kinds: list[str]) -> LlamaBenchAxes:
        return parse_section(check, value, spec_dir, kinds)

    def runs_kind(self, kind: WorkloadKind) -> bool:
        return kind.name in RUNS_KINDS

    def revisions(self, spec: Spec) -> list[str]:
        return [NAME]  # llama.cpp's revision is its own (the section's source and rev)

    def threads_key(self, axes: LlamaBenchAxes) -> str | None:
        return None  # without `threads`, a class's boards run with the fewest of theirs

    def configs(self, axes: LlamaBenchAxes, kind: WorkloadKind,
                default_threads: int) -> list[LlamaBenchConfig]:
        return axes.configs(default_threads)

    def count_configs(self, axes: LlamaBenchAxes, kind: WorkloadKind,
                      default_threads: int) -> int:
        return len(axes.configs(default_threads))

    # -- planning ------------------------------------------------------------------------------

    def prepare(self, spec: Spec, axes: LlamaBenchAxes, archs: list[str],
                build: BuildFn) -> Prepared:
        """llama-bench for every arch (in this process: its builds are cached for good) and
        the spec's model converted to each GGUF type."""
        adapter = LlamaBenchAdapter(axes.source, axes.rev)
        builds = {(NAME, arch): adapter.build(arch) for arch in archs}
        gguf = {t: adapter.artifact(spec.model, t, axes.gguf) for t in axes.gguf_type}
        catalogue = Catalogue.empty()
        for artifact in gguf.values():
            catalogue.add_file(artifact.path, artifact.sha256)
        models = {a.sha256: (a.path, a.info) for a in gguf.values()}
        return Prepared(builds, models, catalogue, gguf)

    def identities(self, spec: Spec, axes: LlamaBenchAxes, archs: list[str]) -> Prepared:
        raise NeedsBuild(NAME, f"{spec.path}: judging stored runs without building is possible for "
                         "lmc experiments only; this one runs llama-bench (run it, or audit "
                         "without --stored-only)")

    def work(self, point: WorkloadPoint, config: LlamaBenchConfig, record: BuildRecord,
             prepared: Prepared, material: Material, timeout_s: float) -> PlannedWork:
        artifact: Artifact = prepared.inputs[config.gguf_type]
        order = WorkOrder(
            run_key="", label=f"{point.label()} llama-bench {config.gguf_type}",
            engine=NAME, command=NAME,
            binary=record.binary, binary_sha256=record.binary_sha256,
            model_dir=str(artifact.path), model_sha256=artifact.sha256,
            model_file=True,  # one GGUF file, not a model folder
            ids=None,  # llama-bench makes its own tokens
            options=options(point.get("ctx"), point.get("max_new"), config),
            timeout_s=timeout_s,
        )
        return PlannedWork(order, key_model=artifact.sha256, model_sha=artifact.sha256)

    # -- a run -----------------------------------------------------------------------------------

    def build(self, target: str, revision: str | None = None) -> BuildRecord:
        # llama.cpp's revision is its own (source/rev of the spec section), not lmc's
        return build_llama_bench(target, self.source, self.rev)

    def artifact(self, model_dir: Path | None, gguf_type: str,
                 gguf_file: Path | None = None) -> Artifact:
        """The GGUF a run reads: ``gguf_file`` as given, or ``model_dir`` converted."""
        from harness.engines.llamabench.gguf import ensure_converted

        if gguf_file is None:
            assert model_dir is not None  # the spec check demands a model or a gguf
            source_sha = sha256_file(model_dir / "model.safetensors")
            out = self.gguf_dir / f"{model_dir.name}-{source_sha[:16]}-{gguf_type}.gguf"
            gguf_file = ensure_converted(model_dir, gguf_type, out)
            info = {"format": "gguf", "type": gguf_type, "converted_from": str(model_dir),
                    "safetensors_sha256": source_sha}
        else:
            info = {"format": "gguf", "type": gguf_type}
        return Artifact(gguf_file, sha256_file(gguf_file), info)

    def argv(self, command: str, binary: str, model: str | None, stdin_ids: bool,
             options: Sequence[str]) -> list[str]:
        return [binary, "-m", str(model), *options]

    def parse(self, stdout: str, command: str) -> Any:
        rows = json.loads(stdout)
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "samples_ns" in r
                                                 for r in rows):
            raise ValueError("llama-bench printed no list of tests with samples_ns "
                             "(was it run with -o json?)")
        return rows

    def collect(self, transport: Transport, order: WorkOrder, data: Any) -> None:
        """llama-bench leaves nothing on the board."""

    def figures(self, command: str, data: Any) -> Figures:
        result = Figures()
        tests = []
        for row in data:
            n_prompt, n_gen = int(row["n_prompt"]), int(row["n_gen"])
            mean_ms = float(row["avg_ns"]) / 1e6
            if n_prompt and not n_gen:
                result.prefill_ms, result.prompt_tokens = mean_ms, n_prompt
            elif n_gen and not n_prompt:
                result.decode_ms_per_token = mean_ms / n_gen
            tests.append({"test": bench_test_name(row)}
                         | {k: v for k, v in row.items() if k not in BUILD_FIELDS})
        build = {k: data[0].get(k) for k in BUILD_FIELDS} if data else {}
        result.extra = {"llama_bench": {"tests": tests, "build": build}}
        return result

    def outcome(self, command: str, data: Any, figures: Figures) -> Outcome:
        return Outcome(extra=figures.extra)  # every test row verbatim, with its samples

    def rebuild(self, build: dict[str, Any]) -> BuildRecord:
        raise InputError(f"{NAME} builds are not made again by `reproduce`")

    def rerun(self, stored: StoredRun, timeout_s: float) -> Rerun:
        raise InputError(f"{NAME} runs are not rerun by `reproduce`")

    def health_argv(self, binary: str) -> list[str]:
        return [binary, "--version"]

    def resident_weights(self, spec: Spec, axes: LlamaBenchAxes) -> dict[str, int]:
        return {}  # a GGUF's own layout: not judged before the run

    def health_verdict(self, stdout: str, stderr: str, arch: str) -> tuple[bool, str]:
        """``llama-bench --version`` prints its version and build on stderr ("version: ...")."""
        first = stderr.strip().splitlines()[0] if stderr.strip() else ""
        return first.startswith("version:"), first or "printed nothing on stderr"
