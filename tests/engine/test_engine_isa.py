"""lmc built for every instruction-set level (devices.isa), each run on this machine: the x86-64
levels it has natively, the aarch64 levels under qemu with the CPU model of each (Cortex-A72:
no dot product; Cortex-A76: dot product; max: i8mm). Each level's output is held to the v3
build's: q8 weight products sum exactly in integers on every path (maddubs, VNNI's vpdpbusd,
NEON's sdot, portable C), and the f32/bf16 tiles sum each lane in the 8-wide kernel's order
(AVX-512 takes two rows a load), so every x86 level gives the same bits; the aarch64 levels
are held to the same tolerance as the aarch64 test in test_engine_model (libm's expf). The
disassembly proves which instructions each build holds: none of the dot-product ones in the
armv8-a build, VNNI's and 512-bit FMAs in the v4 ones."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixtures_engine import TINY_SPECS, lmc_json, run_lmc, write_tokens
from test_engine_model import prompt_ids, rel_err

from devices import isa
from harness.engines.lmc.build import build_engine

MODEL = "gqa2_untied_bf16"
MAX_NEW = 4
# lmc's options per weights case: --bf16-acts rounds the products' activations to bf16, and
# at v4-vnni the prefill panels take them by vdpbf16ps (two products a lane, high half first)
WEIGHTS = {"f32": ("--wq", "f32"), "bf16": ("--wq", "bf16"), "q8": ("--wq", "q8"),
           "bf16-acts": ("--wq", "bf16", "--bf16-acts")}
X86_HERE = [lv.name for lv in isa.LEVELS["x86_64"] if not isa.missing(lv, isa.host_features())]


def qemu(cpu: str) -> list[str]:
    if not shutil.which("qemu-aarch64-static"):
        pytest.fail("qemu-aarch64-static is not installed (scripts/setup.sh installs it)")
    return ["qemu-aarch64-static", "-cpu", cpu]


@pytest.fixture(scope="module")
def builds() -> dict[str, Path]:
    """Each level's binary, built once (x86-64 levels this machine runs, and every aarch64
    level)."""
    targets = [f"x86_64:{name}" for name in X86_HERE] + \
        [f"aarch64:{lv.name}" for lv in isa.LEVELS["aarch64"]]
    return {target: Path(build_engine(target=target).binary) for target in targets}


def disassembly(binary: Path, arch: str) -> str:
    objdump = "objdump" if arch == "x86_64" else "aarch64-linux-gnu-objdump"
    return subprocess.run([objdump, "-d", "--no-show-raw-insn", str(binary)],
                          capture_output=True, text=True, check=True).stdout


def mnemonics(text: str, names: str) -> int:
    """How many instructions of the disassembly are one of ``names`` (a regex alternation)."""
    return len(re.findall(rf"^\s*[0-9a-f]+:\s+(?:{names})\s", text, flags=re.MULTILINE))


def generate(argv: list[str], model: Path, prompt: Path, dump: Path, *extra: str):
    out = lmc_json(argv, "generate", "--model", model, "--prompt", prompt,
                   "--max-new", MAX_NEW, "--dump-logits", dump, *extra)
    return out["tokens"], np.fromfile(dump, dtype=np.float32)


@pytest.mark.skipif(isa.host_features() == frozenset() or "v3" not in X86_HERE,
                    reason="needs an x86-64-v3 machine (the reference level)")
def test_every_x86_level_here_matches_v3(builds, tiny_model, tmp_path):
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    reference = {wq: generate([str(builds["x86_64:v3"])], model, prompt,
                              tmp_path / f"v3-{wq}.bin", "--wq", wq)
                 for wq in ("f32", "bf16", "q8")}
    for name in X86_HERE:
        binary = builds[f"x86_64:{name}"]
        info = lmc_json([str(binary)], "info")
        assert info["isa"] == name
        level = isa.level(name)
        assert ("avx512" in info["simd"]) == ("avx512f" in level.features)
        assert ("vnni" in info["simd"]) == ("avx512_vnni" in level.features)
        for wq, (tokens, logits) in reference.items():
            got_tokens, got = generate([str(binary)], model, prompt,
                                       tmp_path / f"{name}-{wq}.bin", "--wq", wq)
            assert got_tokens == tokens, (name, wq)
            # q8: integer sums on every path; f32 and bf16: AVX-512's quad tiles sum each
            # lane as the 8-wide kernel does, and portable C (v2) in the same order
            assert got.tobytes() == logits.tobytes(), (name, wq)
    # the VNNI level's q8 products are vpdpbusd, v4's quad tiles 512-bit FMAs; v3 has neither
    v3 = disassembly(builds["x86_64:v3"], "x86_64")
    assert mnemonics(v3, "vpdpbusd") == 0 and "%zmm" not in v3
    if "v4-vnni" in X86_HERE:
        vnni = disassembly(builds["x86_64:v4-vnni"], "x86_64")
        assert mnemonics(vnni, "vpdpbusd") > 0
        assert len(re.findall(r"vpdpbusd\s[^\n]*%zmm", vnni)) > 0  # the q8 quads' 512-bit form
        assert len(re.findall(r"vdpbf16ps\s[^\n]*%zmm", vnni)) > 0  # --bf16-acts' panels
    assert mnemonics(v3, "vdpbf16ps") == 0
    for name in ("v4", "v4-vnni"):
        if name in X86_HERE:
            code = disassembly(builds[f"x86_64:{name}"], "x86_64")
            assert len(re.findall(r"vfmadd\d+ps\s+%zmm", code)) > 0, name
            assert (mnemonics(code, "vdpbf16ps") > 0) == (name == "v4-vnni"), name


@pytest.mark.skipif(isa.host_features() == frozenset() or "v3" not in X86_HERE,
                    reason="needs an x86-64-v3 machine (the reference level)")
@pytest.mark.parametrize("threads", [1, 2])
def test_every_x86_level_gives_v3_bits_at_the_prefill_tiles_edges(builds, tiny_model, tmp_path,
                                                                  threads):
    """The prefill panels (v4: two quads x 4 tokens of 512-bit accumulators; v3: one quad x 3
    tokens) at their edges: 41 tokens (a chunk of 41: 10 tiles of 4 and 1, 13 of 3 and 2)
    and 70 (64 + 6); widths 40 and 70 (a 6-column tail), 70 rows (17 quads: two-quad panels,
    then one quad alone, then 2 plain rows), 318 rows in the tied lm_head. Every prompt
    position's logits (--dump-logits) are v3's bits, f32, bf16, q8 and bf16 with
    --bf16-acts (at v4, q8 quads go two rows a 512-bit register too; q8 blocks one by one
    here, 8 at a time in the wide MLP's down projection, whose 1100 columns also make two
    column blocks of a panel, the second of them widened from bf16 at an offset below v4; at
    v4-vnni, --bf16-acts' 16-column steps are vdpbf16ps)."""
    cases = (("odd_widths_tied_bf16", ("f32", "bf16", "q8", "bf16-acts")),
             ("wide_mlp_f32", ("q8", "bf16", "bf16-acts")))
    for model_name, wqs in cases:
        spec = TINY_SPECS[model_name]
        model = tiny_model(model_name)
        ids = prompt_ids(spec.vocab, n=70)
        for n in (41, 70):
            prompt = write_tokens(tmp_path / f"prompt{n}.txt", ids[:n])
            for wq in wqs:
                runs = {name: generate([str(builds[f"x86_64:{name}"])], model, prompt,
                                       tmp_path / f"{name}-{wq}-{n}.bin", *WEIGHTS[wq],
                                       "--threads", threads)
                        for name in X86_HERE}
                tokens, logits = runs["v3"]
                assert logits.size == n * spec.vocab
                for name, (got_tokens, got) in runs.items():
                    assert got_tokens == tokens, (model_name, name, wq, n)
                    assert got.tobytes() == logits.tobytes(), (model_name, name, wq, n)


def test_the_armv8_a_build_has_no_dot_product_and_runs_on_a_cortex_a72(builds, tiny_model,
                                                                       tmp_path):
    plain = builds["aarch64:armv8-a"]
    dotprod = builds["aarch64:armv8.2-a+dotprod"]
    assert mnemonics(disassembly(plain, "aarch64"), "sdot|udot|usdot|sudot") == 0
    assert mnemonics(disassembly(dotprod, "aarch64"), "sdot") > 0  # the check can see them
    assert lmc_json([*qemu("cortex-a72"), str(plain)], "info")["isa"] == "armv8-a"

    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    x86 = [str(builds[f"x86_64:{X86_HERE[-1]}"])] if X86_HERE else None
    for wq in ("q8", "f32"):
        a72 = generate([*qemu("cortex-a72"), str(plain)], model, prompt,
                       tmp_path / f"a72-{wq}.bin", "--wq", wq)
        a76 = generate([*qemu("cortex-a76"), str(dotprod)], model, prompt,
                       tmp_path / f"a76-{wq}.bin", "--wq", wq)
        assert a72[0] == a76[0]
        assert rel_err(a72[1], a76[1]) < 1e-5
        if x86 is not None:
            native = generate(x86, model, prompt, tmp_path / f"x86-{wq}.bin", "--wq", wq)
            assert a72[0] == native[0]
            assert rel_err(a72[1], native[1]) < 1e-5
    # why the level matters: the dot-product build dies on the A72 at its first sdot
    crashed = run_lmc([*qemu("cortex-a72"), str(dotprod)], "generate", "--model", model,
                      "--prompt", prompt, "--max-new", MAX_NEW, "--wq", "q8")
    assert crashed.returncode != 0 and "Illegal instruction" in crashed.stderr


def test_the_i8mm_level_runs_under_qemu_max(builds, tiny_model, tmp_path):
    # q8 products are smmla at the i8mm level only; the dotprod build has none to die on
    i8mm_code = disassembly(builds["aarch64:armv8.2-a+i8mm"], "aarch64")
    assert mnemonics(i8mm_code, "smmla") > 0
    assert mnemonics(disassembly(builds["aarch64:armv8.2-a+dotprod"], "aarch64"),
                     "smmla|ummla|usmmla") == 0
    info = lmc_json([*qemu("max"), str(builds["aarch64:armv8.2-a+i8mm"])], "info")
    assert "i8mm" in info["simd"]
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(320))
    i8mm = generate([*qemu("max"), str(builds["aarch64:armv8.2-a+i8mm"])], model, prompt,
                    tmp_path / "max.bin", "--wq", "q8")
    a76 = generate([*qemu("cortex-a76"), str(builds["aarch64:armv8.2-a+dotprod"])], model,
                   prompt, tmp_path / "a76.bin", "--wq", "q8")
    assert i8mm[0] == a76[0] and i8mm[1].tobytes() == a76[1].tobytes()
