"""Building `lmc` with ninja, for every target architecture.

A build is keyed by (source hash, toolchain, compiler version, flags): the build directory is
named after that key, so unchanged sources rebuild nothing and two configurations never share
object files. The harness writes the ``build.ninja`` itself and runs the ``ninja`` from PyPI.

The engine source is every ``engine/*.c`` and ``engine/*.h``. Build facts reach the binary
through a generated header (``-include lmc_build.h``) so that ``lmc info`` can report them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from db.lmc_axes import NAME
from devices.isa import IsaLevel
from harness import ENGINE_DIR, REPO_ROOT
from harness.engines.base import BuildRecord, build_lock, host_arch, parse_target
from harness.errors import InputError, RunFailure
from harness.identity import (
    code_hash,
    files_hash,
    git_output,
    sha256_file,
    worktree_revision,
)

TARGETS = ("x86_64", "aarch64")
# the folders of this repository lmc is built from: its revisions are the commits that change them
SOURCE_PATHS = (ENGINE_DIR.relative_to(REPO_ROOT).as_posix(),)
VARIANTS = ("release", "asan")

COMMON_CFLAGS = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter"]
RELEASE_CFLAGS = ["-O3", "-fno-math-errno"]
ASAN_CFLAGS = [
    "-O1",
    "-g",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
# The target flags are the instruction-set level's (devices.isa.LEVELS): x86-64-v2 ... v4 with
# VNNI, armv8-a ... i8mm. The engine's kernels follow the compiler's macros (simd.h): a level
# without AVX2 or NEON gets portable C.
LIBS = ["-lm", "-lpthread"]


def default_build_root() -> Path:
    return Path(os.environ.get("BENCHFARM_BUILD_DIR", REPO_ROOT / "build" / "engine"))


# ---------------------------------------------------------------------------------------------
# Toolchains
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Toolchain:
    name: str
    target: str
    cc: tuple[str, ...]
    static: bool

    def version(self) -> str:
        try:
            out = subprocess.run(
                [*self.cc, "--version"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise RunFailure(
                f"compiler {' '.join(self.cc)!r} for target {self.target} is not usable ({exc}); "
                "run scripts/setup.sh to install the toolchains"
            ) from exc
        return out.splitlines()[0].strip() if out else "unknown"


def find_toolchain(target: str, name: str = "gcc") -> Toolchain:
    if target not in TARGETS:
        raise InputError(f"unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    if name == "zig":
        zig = shutil.which("zig")
        cc = (zig, "cc") if zig else (sys.executable, "-m", "ziglang", "cc")
        triple = "x86_64-linux-musl" if target == "x86_64" else "aarch64-linux-musl"
        return Toolchain("zig", target, (*cc, "-target", triple), static=True)
    if name != "gcc":
        raise InputError(f"unknown toolchain {name!r}; allowed: gcc, zig")
    if target == host_arch():
        return Toolchain("gcc", target, (os.environ.get("CC", "gcc"),), static=False)
    cross = f"{target}-linux-gnu-gcc"
    if not shutil.which(cross):
        raise RunFailure(
            f"cross compiler {cross} not found; install Debian's gcc-{target.replace('_', '-')}"
            "-linux-gnu (scripts/setup.sh does)"
        )
    return Toolchain("gcc", target, (cross,), static=True)


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


def engine_sources(engine_dir: Path) -> list[Path]:
    files = sorted(p for p in engine_dir.iterdir() if p.suffix in (".c", ".h") and p.is_file())
    if not any(p.suffix == ".c" for p in files):
        raise InputError(f"no engine sources (*.c) in {engine_dir}")
    return files


def source_hash(engine_dir: Path) -> str:
    """sha256 over the names and contents of the engine's sources, in name order."""
    return files_hash(engine_sources(engine_dir))


def export_revision(rev: str, dest: Path) -> tuple[str, Path]:
    """Extract ``engine/`` of git revision ``rev`` into ``dest``; return (commit, engine dir)."""
    commit = git_output("rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "engine"], cwd=REPO_ROOT, capture_output=True
    )
    if archive.returncode != 0:
        raise InputError(f"revision {rev} has no engine/: {archive.stderr.decode().strip()}")
    tar_path = dest / "engine.tar"
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
    return commit, dest / "engine"


# ---------------------------------------------------------------------------------------------
# The build record and the ninja file
# ---------------------------------------------------------------------------------------------


def flags_for(toolchain: Toolchain, variant: str,
              level: IsaLevel) -> tuple[list[str], list[str]]:
    if variant not in VARIANTS:
        raise InputError(f"unknown build variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    cflags = COMMON_CFLAGS + (RELEASE_CFLAGS if variant == "release" else ASAN_CFLAGS)
    cflags = cflags + list(level.cflags)
    if toolchain.name == "zig":  # clang's -mtune takes CPU names only
        cflags = [f for f in cflags if not f.startswith("-mtune=")]
    ldflags = list(LIBS)
    if variant == "asan":
        ldflags = ["-fsanitize=address,undefined", *ldflags]
    elif toolchain.static:
        ldflags = ["-static", *ldflags]
    return cflags, ldflags


def write_ninja(build_dir: Path, sources: list[Path], cc: tuple[str, ...], cflags: list[str],
                ldflags: list[str], output: str = "lmc", build_header: bool = True) -> None:
    """Write build.ninja linking every ``*.c`` of ``sources`` into ``build_dir/output``.

    With ``build_header`` each object depends on, and force-includes, ``lmc_build.h``."""
    q = shlex.quote
    include = " -include lmc_build.h" if build_header else ""
    lines = [
        "# generated by harness.engines.lmc.build; do not edit",
        f"cc = {' '.join(q(c) for c in cc)}",
        f"cflags = {' '.join(q(f) for f in cflags)}{include} -I.",
        f"ldflags = {' '.join(q(f) for f in ldflags)}",
        "rule cc",
        "  command = $cc -MD -MF $out.d $cflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CC $out",
        "rule link",
        "  command = $cc $in -o $out.tmp $ldflags && mv -f $out.tmp $out",
        "  description = LINK $out",
    ]
    objects = []
    for src in sources:
        if src.suffix != ".c":
            continue
        obj = f"obj/{src.stem}.o"
        objects.append(obj)
        implicit = " | lmc_build.h" if build_header else ""
        lines.append(f"build {obj}: cc {src.as_posix()}{implicit}")
    lines.append(f"build {output}: link {' '.join(objects)}")
    lines.append(f"default {output}")
    (build_dir / "build.ninja").write_text("\n".join(lines) + "\n")


def write_build_header(build_dir: Path, values: dict[str, str]) -> None:
    body = ["/* generated by harness.engines.lmc.build: facts `lmc info` reports */"]
    for key, value in values.items():
        body.append(f"#define {key} {json.dumps(value)}")
    header = build_dir / "lmc_build.h"
    text = "\n".join(body) + "\n"
    if not header.exists() or header.read_text() != text:
        header.write_text(text)


def run_ninja(build_dir: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ninja", "-C", str(build_dir)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RunFailure(f"ninja failed in {build_dir}:\n{tail}")
    return proc.stdout


@dataclass
class _Planned:
    """A build before it runs: its identity, and where its directory and binary go."""

    record: BuildRecord  # binary_sha256 empty: nothing is built yet
    sources: list[Path]
    toolchain: Toolchain
    build_dir: Path


def _plan_build(src_dir: Path, revision: str, target: str, variant: str, toolchain_name: str,
                build_root: Path) -> _Planned:
    """``target``: ``arch`` or ``arch:level`` (harness.engines.base.parse_target)."""
    target, level = parse_target(target)
    toolchain = find_toolchain(target, toolchain_name)
    sources = engine_sources(src_dir)
    src_hash = source_hash(src_dir)
    compiler_version = toolchain.version()
    cflags, ldflags = flags_for(toolchain, variant, level)
    key_material = json.dumps(
        [src_hash, toolchain.name, list(toolchain.cc), compiler_version, cflags, ldflags]
    )
    build_key = hashlib.sha256(key_material.encode()).hexdigest()[:16]
    build_dir = build_root / f"{target}-{level.name}-{variant}-{build_key}"
    record = BuildRecord(
        target=target, variant=variant, toolchain=toolchain.name,
        compiler=" ".join(toolchain.cc), compiler_version=compiler_version, cflags=cflags,
        ldflags=ldflags, source_hash=src_hash, revision=revision, build_key=build_key,
        binary=str(build_dir / "lmc"), binary_sha256="", build_seconds=0.0, rebuilt=False,
        engine=NAME, isa=level.name, extra={"code_hash": code_hash(sources)},
    )
    return _Planned(record, sources, toolchain, build_dir)


@contextlib.contextmanager
def _engine_source(rev: str | None, engine_dir: Path | None):
    """(engine source dir, revision text): the working tree's, or revision ``rev`` exported
    into a temporary directory that lives as long as the context."""
    if rev is None:
        yield engine_dir or ENGINE_DIR, worktree_revision(SOURCE_PATHS)
        return
    with tempfile.TemporaryDirectory(prefix="benchfarm-src-") as tmp:
        revision, src_dir = export_revision(rev, Path(tmp))
        yield src_dir, revision


def build_identity(target: str | None = None, rev: str | None = None,
                   variant: str = "release", toolchain_name: str = "gcc",
                   build_root: Path | None = None, engine_dir: Path | None = None) -> BuildRecord:
    """The record ``build_engine`` would return, without building or writing anything: what a
    run key needs (source hash, target, compiler version, flags). ``binary_sha256`` is empty
    (the binary may not exist)."""
    with _engine_source(rev, engine_dir) as (src_dir, revision):
        return _plan_build(src_dir, revision, target or host_arch(), variant, toolchain_name,
                           build_root or default_build_root()).record


def build_engine(
    target: str | None = None,
    rev: str | None = None,
    variant: str = "release",
    toolchain_name: str = "gcc",
    build_root: Path | None = None,
    engine_dir: Path | None = None,
) -> BuildRecord:
    """Build `lmc` for ``target`` (``arch`` or ``arch:level``; default: this machine at the
    highest level it runs) and return its record."""
    started = time.monotonic()
    with _engine_source(rev, engine_dir) as (src_dir, revision):
        planned = _plan_build(src_dir, revision, target, variant, toolchain_name,
                              build_root or default_build_root())
        record, build_dir = planned.record, planned.build_dir
        binary = Path(record.binary)
        build_dir.mkdir(parents=True, exist_ok=True)
        # Several processes (parallel test sessions, Ray workers) may build the same key at
        # once: one builds, the others wait and then find the finished binary.
        with build_lock(build_dir):
            record.rebuilt = not binary.exists()
            if record.rebuilt:
                (build_dir / "obj").mkdir(parents=True, exist_ok=True)
                # Sources are copied so that the build directory is self-contained and a
                # revision's sources outlive the temporary checkout.
                src_copy = build_dir / "src"
                src_copy.mkdir(exist_ok=True)
                for path in planned.sources:
                    shutil.copy2(path, src_copy / path.name)
                copied = [src_copy / p.name for p in planned.sources]
                write_build_header(build_dir, {
                    "LMC_SOURCE_HASH": record.source_hash,
                    "LMC_COMPILER": record.compiler_version,
                    "LMC_FLAGS": " ".join(record.cflags + record.ldflags),
                    "LMC_TARGET": record.target,
                    "LMC_ISA": record.isa,
                })
                write_ninja(build_dir, copied, planned.toolchain.cc, record.cflags,
                            record.ldflags)
                run_ninja(build_dir)
    record.binary_sha256 = sha256_file(binary)
    record.build_seconds = round(time.monotonic() - started, 3)
    (build_dir / "record.json").write_text(record.to_json())
    return record


def build_c_program(name: str, sources: list[Path], target: str | None = None,
                    build_root: Path | None = None) -> Path:
    """Build a stand-alone C program (e.g. a bench kernel) with the engine's release flags.

    Uses the same toolchains, flags and ninja writer as :func:`build_engine`; the build
    directory is keyed by the sources' contents and the toolchain, so reruns rebuild nothing.
    Returns the path of the binary."""
    target, level = parse_target(target)
    toolchain = find_toolchain(target)
    for src in sources:
        if not src.is_file():
            raise InputError(f"C source {src} does not exist")
    cflags, ldflags = flags_for(toolchain, "release", level)
    key_material = json.dumps(
        [files_hash(sources), list(toolchain.cc), toolchain.version(), cflags, ldflags]
    )
    build_key = hashlib.sha256(key_material.encode()).hexdigest()[:16]
    build_dir = ((build_root or REPO_ROOT / "build" / "programs")
                 / f"{target}-{level.name}-{name}-{build_key}")
    binary = build_dir / name
    (build_dir / "obj").mkdir(parents=True, exist_ok=True)
    with build_lock(build_dir):  # as for the engine: concurrent builds of one key wait
        if not binary.exists():
            write_ninja(build_dir, [src.resolve() for src in sources], toolchain.cc, cflags,
                        ldflags, output=name, build_header=False)
            run_ninja(build_dir)
    return binary
