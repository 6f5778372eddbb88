"""Building llama.cpp's ``llama-bench`` with CMake + Ninja, for x86_64 and (cross) aarch64.

The source is, in order of preference, what the spec's ``[llama-bench]`` section names:

- ``source = "pypi"`` (the default): the llama.cpp tree vendored in the ``llama-cpp-python``
  sdist, fetched once with ``pip download --no-binary :all: --no-deps`` into
  ``<cache>/sdist/`` and reused offline from then on;
- ``source = "PATH"``: a llama.cpp source tree as it is on disk;
- ``source = "PATH"`` with ``rev = "REV"``: that git revision of the repository at PATH.

Only the ``llama-bench`` target is built (not the library's tests, tools or server), statically
linked for aarch64 so that a board needs no libstdc++ of the right version; its helper library
llama-common is compiled as unity sources (``unity_common.cmake``: a quarter less CPU time for
the whole build, docs/performance.md).
The build directory is keyed by (source identity, target, compiler version, CMake flags and
``unity_common.cmake``): unchanged inputs rebuild
nothing. The cache lives outside any work tree, ``~/.cache/benchfarm/llama-cpp/`` (or under
``$XDG_CACHE_HOME``; ``BENCHFARM_LLAMA_BUILD_DIR`` overrides it), so a machine pays the build
once (docs/performance.md says how long) for every clone, every
worktree and the tests alike: ``benchfarm build --engine llama-bench`` and the test fixtures
both call ``build_llama_bench`` with this root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict
from pathlib import Path

from harness.engines.base import BuildRecord, build_lock, host_arch, parse_target
from harness.errors import InputError, RunFailure
from harness.identity import sha256_file

# The sdist whose vendored llama.cpp is the default source (pinned: a build key must not move
# under a user's feet when PyPI publishes a new release).
SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
PYPI = "pypi"

COMMON_CMAKE = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
]
# per architecture: a cross build for aarch64 from an x86_64 host
TARGET_CMAKE = {
    "x86_64": [],
    "aarch64": ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
                "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
                # a static binary cannot link the cross toolchain's libgomp.so: ggml's own
                # thread pool instead of OpenMP
                "-DGGML_OPENMP=OFF", "-DCMAKE_EXE_LINKER_FLAGS=-static"],
}
# per instruction-set level (devices.isa.LEVELS): ggml's switches for the same instructions as
# lmc's build of that level (v3's and the dot-product level's are the flags of every build
# before there were levels, so those builds keep their keys)
_V3 = ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
_V4 = [*_V3, "-DGGML_AVX512=ON"]
LEVEL_CMAKE = {
    "v2": ["-DGGML_SSE42=ON", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF",
           "-DGGML_F16C=OFF"],
    "v3": _V3,
    "v4": _V4,
    "v4-vnni": [*_V4, "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"],
    "armv8-a": ["-DGGML_CPU_ARM_ARCH=armv8-a"],
    "armv8.2-a+dotprod": ["-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16"],
    "armv8.2-a+i8mm": ["-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16+i8mm"],
}
# What a source tree's identity is computed over (the files the llama-bench target compiles).
# Makes llama-common a unity build; its text, not its path, is part of the build key (so every
# clone shares one build).
UNITY_COMMON = Path(__file__).with_name("unity_common.cmake")
SOURCE_DIRS = ("CMakeLists.txt", "cmake", "ggml", "src", "include", "common", "tools",
               "vendor")


def default_root() -> Path:
    """Where sources and builds are cached: one per machine (and user), not per clone."""
    if os.environ.get("BENCHFARM_LLAMA_BUILD_DIR"):
        return Path(os.environ["BENCHFARM_LLAMA_BUILD_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "benchfarm" / "llama-cpp"


def _run(argv: list[str], what: str, cwd: Path | None = None, niceness: int = 0) -> str:
    if niceness:
        argv = ["nice", "-n", str(niceness), *argv]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise RunFailure(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def sdist_tree(root: Path) -> tuple[Path, str, str]:
    """(llama.cpp tree, sha256 of the sdist, revision text) of the pinned sdist, fetched once."""
    cache = root / "sdist"
    cache.mkdir(parents=True, exist_ok=True)
    name = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    archive = cache / name
    with build_lock(cache):
        if not archive.exists():
            _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                  "--dest", str(cache), f"{SDIST_PACKAGE}=={SDIST_VERSION}"],
                 f"pip download {SDIST_PACKAGE}=={SDIST_VERSION} (needs the package registry "
                 f"once; afterwards the copy in {cache} is used)")
        digest = sha256_file(archive)
        tree = root / f"src-{digest[:16]}"
        if not (tree / "CMakeLists.txt").exists():
            prefix = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
            partial = root / f"src-{digest[:16]}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                for member in members:
                    member.name = member.name[len(prefix):]
                tar.extractall(partial, members=[m for m in members if m.name],
                               filter="data")
            partial.replace(tree)
    return tree, digest, f"{SDIST_PACKAGE} {SDIST_VERSION} sdist"


def tree_hash(tree: Path) -> str:
    """sha256 over the relative paths and contents of the tree's build inputs."""
    digest = hashlib.sha256()
    for top in SOURCE_DIRS:
        base = tree / top
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in paths:
            digest.update(path.relative_to(tree).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def git_tree(repo: Path, rev: str, root: Path) -> tuple[Path, str, str]:
    """(tree, commit, revision text) of revision ``rev`` of the git repository ``repo``."""
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(f"llama-bench source {repo}: {rev!r} is not a git revision there "
                         f"({proc.stderr.strip()})")
    commit = proc.stdout.strip()
    tree = root / f"git-{commit[:16]}"
    with build_lock(root):
        if not (tree / "CMakeLists.txt").exists():
            partial = root / f"git-{commit[:16]}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            archive = partial / "src.tar"
            with open(archive, "wb") as fh:
                subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit],
                               stdout=fh, check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(partial, filter="data")
            archive.unlink()
            partial.replace(tree)
    return tree, commit, f"git {commit}"


def resolve_source(source: str, rev: str | None, root: Path) -> tuple[Path, str, str]:
    """(tree, source identity, revision text) for a spec's ``source`` and ``rev``."""
    root.mkdir(parents=True, exist_ok=True)
    if source == PYPI:
        if rev is not None:
            raise InputError("llama-bench: `rev` needs `source` to name a git repository")
        return sdist_tree(root)
    path = Path(source).expanduser().resolve()
    if not (path / "CMakeLists.txt").is_file() or not (path / "tools" / "llama-bench").is_dir():
        raise InputError(f"llama-bench source {path} is not a llama.cpp source tree "
                         "(no CMakeLists.txt and tools/llama-bench)")
    if rev is not None:
        return git_tree(path, rev, root)
    return path, tree_hash(path), f"tree {path}"


def compiler_version(target: str) -> tuple[str, str]:
    cxx = "g++" if target == host_arch() else f"{target}-linux-gnu-g++"
    if not shutil.which(cxx):
        raise RunFailure(f"C++ compiler {cxx} not found; install Debian's "
                         f"g++-{target.replace('_', '-')}-linux-gnu (scripts/setup.sh does)")
    return cxx, _run([cxx, "--version"], f"{cxx} --version").splitlines()[0].strip()


def build_llama_bench(target: str | None = None, source: str = PYPI, rev: str | None = None,
                      root: Path | None = None, niceness: int = 0) -> BuildRecord:
    """Build ``llama-bench`` for ``target`` (``arch`` or ``arch:level``; default: this machine
    at the highest level it runs) and return its record. ``niceness``: the compilers' CPU
    priority (``nice -n``), for a build in the background."""
    target, level = parse_target(target)
    for tool in ("cmake", "ninja"):
        if not shutil.which(tool):
            raise RunFailure(f"{tool} not found; install Debian's {tool} "
                             "(scripts/setup.sh does)")
    root = root or default_root()
    started = time.monotonic()
    tree, identity, revision = resolve_source(source, rev, root)
    cxx, version = compiler_version(target)
    flags = COMMON_CMAKE + TARGET_CMAKE[target] + LEVEL_CMAKE[level.name]
    if target == "aarch64":  # the old order of the flags: the dot-product level keeps its key
        flags = COMMON_CMAKE + TARGET_CMAKE[target][:4] + LEVEL_CMAKE[level.name] \
            + TARGET_CMAKE[target][4:]
    unity = UNITY_COMMON.read_text()
    key = hashlib.sha256(json.dumps([identity, target, version, flags, unity]).encode()
                         ).hexdigest()[:16]
    build_dir = root / f"{target}-{key}"
    binary = build_dir / "bin" / "llama-bench"
    build_dir.mkdir(parents=True, exist_ok=True)
    with build_lock(build_dir):
        rebuilt = not binary.exists()
        if rebuilt:
            _run(["cmake", "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", *flags,
                  f"-DCMAKE_PROJECT_INCLUDE={UNITY_COMMON}"],
                 f"cmake configure of {tree} for {target}", niceness=niceness)
            _run(["ninja", "-C", str(build_dir), "llama-bench"],
                 f"ninja llama-bench for {target} in {build_dir}", niceness=niceness)
    record = BuildRecord(
        target=target, variant="release", toolchain="gcc+cmake", compiler=cxx,
        compiler_version=version, cflags=flags, ldflags=[], source_hash=identity,
        revision=revision, build_key=key, binary=str(binary),
        binary_sha256=sha256_file(binary), build_seconds=round(time.monotonic() - started, 3),
        rebuilt=rebuilt, extra={"source": source, "rev": rev, "tree": str(tree)},
        engine="llama-bench", isa=level.name)
    (build_dir / "record.json").write_text(json.dumps(asdict(record), indent=2, sort_keys=True))
    return record
