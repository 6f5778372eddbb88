"""Instruction-set levels: what a board's CPU can execute, and which build it gets.

A level is a named set of CPU features (as /proc/cpuinfo spells them: x86 ``flags``, ARM
``Features``) together with the compiler flags of the build made for it. Levels of one
architecture are ordered; a board gets the highest level whose features it has all of, unless
the inventory (``isa = "..."``) or the spec pins one. A board's features come from its
fingerprint's ``cpu_features`` (read from /proc/cpuinfo on the board), except on an emulated
board, whose CPU is the emulator's: there they come from the ``-cpu`` model of its
``exec_prefix`` (the host's /proc/cpuinfo says nothing about it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from devices.errors import DeviceError


@dataclass(frozen=True)
class IsaLevel:
    name: str
    arch: str
    features: frozenset[str]  # every one must be on the board
    cflags: tuple[str, ...]  # lmc's (and the bench kernels') target flags
    summary: str


_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_ARMV8 = frozenset({"fp", "asimd"})
_DOTPROD = _ARMV8 | {"asimdhp", "asimddp"}

# lowest first, per architecture
LEVELS: dict[str, tuple[IsaLevel, ...]] = {
    "x86_64": (
        IsaLevel("v2", "x86_64", _V2, ("-march=x86-64-v2", "-mtune=generic"),
                 "SSE4.2, no AVX"),
        IsaLevel("v3", "x86_64", _V3, ("-march=x86-64-v3", "-mtune=generic"),
                 "AVX2, FMA, F16C"),
        IsaLevel("v4", "x86_64", _V4, ("-march=x86-64-v4", "-mtune=generic"),
                 "AVX-512 F/BW/CD/DQ/VL"),
        # VNNI gives q8 dot products in one instruction (vpdpbusd); BF16 comes with it on every
        # part that has AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and 5)
        IsaLevel("v4-vnni", "x86_64", _V4 | {"avx512_vnni", "avx512_bf16"},
                 ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16", "-mtune=generic"),
                 "AVX-512 with VNNI and BF16"),
    ),
    "aarch64": (
        IsaLevel("armv8-a", "aarch64", _ARMV8, ("-march=armv8-a", "-mtune=cortex-a72"),
                 "NEON (Cortex-A53/A72)"),
        IsaLevel("armv8.2-a+dotprod", "aarch64", _DOTPROD,
                 ("-march=armv8.2-a+dotprod+fp16", "-mtune=cortex-a76"),
                 "NEON with dot products and fp16 (Cortex-A55/A76, RK3588)"),
        IsaLevel("armv8.2-a+i8mm", "aarch64", _DOTPROD | {"i8mm"},
                 ("-march=armv8.2-a+dotprod+fp16+i8mm", "-mtune=neoverse-n2"),
                 "dot products and int8 matrix multiply (Neoverse N2/V2, Cortex-X2+)"),
    ),
}
BY_NAME = {level.name: level for levels in LEVELS.values() for level in levels}
# the level a board gets when nothing is known of its CPU (a test's placeholder board): the
# one every build used before there were levels
FALLBACK = {"x86_64": "v3", "aarch64": "armv8.2-a+dotprod"}

# QEMU's CPU models: the features an emulated board's CPU has (qemu-aarch64 -cpu MODEL)
QEMU_MODELS: dict[str, frozenset[str]] = {
    "cortex-a53": _ARMV8 | {"crc32"},
    "cortex-a72": _ARMV8 | {"crc32"},
    "cortex-a55": _DOTPROD | {"crc32"},
    "cortex-a76": _DOTPROD | {"crc32"},
    "neoverse-n1": _DOTPROD | {"crc32"},
    "neoverse-n2": _DOTPROD | {"crc32", "i8mm"},
    "max": _DOTPROD | {"crc32", "i8mm"},
}


class IsaError(ValueError):
    """A level that does not exist, or that a board cannot run."""


def level(name: str, arch: str | None = None) -> IsaLevel:
    """The level called ``name`` (of ``arch`` when given); IsaError naming the choices."""
    found = BY_NAME.get(name)
    if found is None or (arch is not None and found.arch != arch):
        names = [lv.name for lv in LEVELS.get(arch, ())] if arch else sorted(BY_NAME)
        raise IsaError(f"unknown instruction-set level {name!r}"
                       + (f" for {arch}" if arch else "") + f"; allowed: {', '.join(names)}")
    return found


def missing(lv: IsaLevel, features: Iterable[str]) -> list[str]:
    """The features of ``lv`` a CPU with ``features`` lacks, sorted (empty: it can run it)."""
    return sorted(lv.features - set(features))


def highest(arch: str, features: Iterable[str]) -> IsaLevel:
    """The highest level of ``arch`` a CPU with ``features`` runs (the lowest if none fits:
    its build is portable C at worst, and the check before a run says what is missing)."""
    have = set(features)
    fitting = [lv for lv in LEVELS[arch] if not missing(lv, have)]
    return fitting[-1] if fitting else LEVELS[arch][0]


def cpuinfo_features(text: str) -> frozenset[str]:
    """The features of /proc/cpuinfo's first ``flags`` (x86) or ``Features`` (ARM) line."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def emulated_model(exec_prefix: Iterable[str]) -> str | None:
    """The ``-cpu MODEL`` of an emulator's argv, or None."""
    argv = list(exec_prefix)
    for i, arg in enumerate(argv[:-1]):
        if arg == "-cpu":
            return argv[i + 1]
    return None


# The first line of /proc/cpuinfo naming the features: one sed, the same on every board.
FEATURES_SCRIPT = "sed -n -E '/^(flags|Features)[[:space:]]*:/{p;q}' /proc/cpuinfo"
_features: dict[tuple[str, str], frozenset[str]] = {}
_features_lock = threading.Lock()


def board_features(device, transport) -> frozenset[str]:
    """The CPU features of ``device`` (a devices.inventory.Device): its emulator's model, or
    /proc/cpuinfo read on the board through ``transport`` (once per board and process).
    DeviceError when the board cannot be read or its emulator model is unknown."""
    if device.emulated and device.exec_prefix:
        model = emulated_model(device.exec_prefix)
        if model in QEMU_MODELS:
            return QEMU_MODELS[model]
        if device.isa:  # the inventory's word for an emulator this table does not know
            return BY_NAME[device.isa].features
        raise DeviceError(device.name, f"emulated with exec_prefix {device.exec_prefix}, "
                                       f"whose CPU model {model!r} has no known features "
                                       f"(known: {', '.join(sorted(QEMU_MODELS))}); pin its "
                                       "level with `isa = \"...\"` in the inventory")
    key = (device.name, device.address)
    with _features_lock:
        if key in _features:
            return _features[key]
    result = transport.run_host(["sh", "-c", FEATURES_SCRIPT], timeout=30.0)
    if result.exit_code != 0:
        raise DeviceError(device.name, f"reading /proc/cpuinfo failed (exit "
                                       f"{result.exit_code}): {result.stderr.strip()[:200]}")
    found = cpuinfo_features(result.stdout)
    with _features_lock:
        _features[key] = found
    return found


def host_features() -> frozenset[str]:
    """This machine's CPU features (its /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return cpuinfo_features(fh.read())
    except OSError:
        return frozenset()


def default_level(arch: str) -> IsaLevel:
    """The level a build for ``arch`` gets when none is named: this machine's highest for its
    own arch (what it can run and test), the fallback (RK3588's) for a cross build."""
    if arch not in LEVELS:
        raise IsaError(f"unknown architecture {arch!r}; allowed: {', '.join(LEVELS)}")
    if arch == os.uname().machine:
        return highest(arch, host_features())
    return level(FALLBACK[arch], arch)


def split_target(target: str) -> tuple[str, IsaLevel]:
    """(arch, level) of a build target, ``arch`` or ``arch:level`` (a bare arch: its
    ``default_level``). IsaError naming the choices for an unknown arch or level."""
    arch, _, name = target.partition(":")
    if arch not in LEVELS:
        raise IsaError(f"unknown target {arch!r}; allowed: {', '.join(LEVELS)}")
    return arch, level(name, arch) if name else default_level(arch)
