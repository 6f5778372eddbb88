"""Engine mutants: lmc with one rule of an article broken, to prove that the audit's check of
that rule can fail (tests/audit/test_mutants.py runs each claim that names a mutant against it
and asserts that its verdict flips).

A mutant is built from a patched scratch copy of engine/ (the release sources are never
touched, so no release build can carry a mutant and the release bits do not change); each edit
names the release text it replaces, which must occur exactly once, so that an engine change
that moves the rule fails loudly here instead of building an unbroken "mutant". Builds are
cached by their sources' hash like any lmc build (harness.engines.lmc.build): one build per
mutant, reused by later test sessions.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from harness import ENGINE_DIR
from harness.engines.base import host_arch
from harness.engines.lmc.build import build_engine, default_build_root
from harness.errors import InputError


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the rule it breaks, in words
    file: str  # the engine source it patches
    edits: tuple[tuple[str, str], ...]  # (release text, mutant text)


MUTANTS = {m.name: m for m in (
    Mutant("budget", "the importance reservation takes k / 2 blocks instead of (k + 1) / 2",
           "select.c", (("picks, 0, (cfg->k + 1) / 2);", "picks, 0, cfg->k / 2);"),)),
    Mutant("recency", "no recency insurance: the last block is kept only when chosen",
           "select.c", (("if (cfg->recency && !s->used[last] && count > n_imp) {",
                         "if (0 && cfg->recency && !s->used[last] && count > n_imp) {"),)),
    Mutant("ties", "ties go to the higher block index", "select.c", (
        ("if (best < 0 || score[b] > score[best]) best = b;",
         "if (best < 0 || score[b] >= score[best]) best = b;"),
        ("if (m == want && !(sc > score[top[m - 1]])) continue;",
         "if (m == want && !(sc >= score[top[m - 1]])) continue;"),
        ("for (; i > 0 && sc > score[top[i - 1]]; i--)",
         "for (; i > 0 && sc >= score[top[i - 1]]; i--)"))),
    Mutant("causal", "each prefill query also sees the next position (one row of the future)",
           "attn_kernel.c", (("int vis = pos0 + t + 1 - p0 < np ? pos0 + t + 1 - p0 : np;",
                              "int vis = pos0 + t + 2 - p0 < np ? pos0 + t + 2 - p0 : np;"),)),
    Mutant("scale", "the optimised kernels drop the 1/sqrt(d) scale (the plain reference keeps "
           "it)", "attn_kernel.c", (
               ("    float scale = 1.0f / sqrtf((float)D);\n    float m[ATTN_MAX_GROUP]",
                "    float scale = 1.0f;\n    float m[ATTN_MAX_GROUP]"),
               ("head g */\n    float scale = 1.0f / sqrtf((float)D);",
                "head g */\n    float scale = 1.0f;"))),
)}


def mutant_sources(name: str, dest: Path) -> Path:
    """engine/ copied into ``dest`` with mutant ``name``'s edits; returns the copy."""
    if name not in MUTANTS:
        raise InputError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    mutant = MUTANTS[name]
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ENGINE_DIR, dest, ignore=shutil.ignore_patterns("*.md"))
    path = dest / mutant.file
    text = path.read_text()
    for old, new in mutant.edits:
        if text.count(old) != 1:
            raise InputError(f"mutant {name}: engine/{mutant.file} holds {old!r} "
                             f"{text.count(old)} times, not once; the rule moved: update "
                             "harness/verify/mutants.py")
        text = text.replace(old, new)
    path.write_text(text)
    return dest


def build_mutant(name: str, build_root: Path | None = None) -> Path:
    """The lmc binary of mutant ``name`` for this machine (built once, then cached)."""
    root = build_root or default_build_root()
    sources = mutant_sources(name, root / "mutant-sources" / name)
    return Path(build_engine(host_arch(), engine_dir=sources, build_root=root).binary)
