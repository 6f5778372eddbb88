"""Fixtures that build the real engine once per test session, and tiny random Qwen3 models.

The models are built with transformers (Qwen3Config + Qwen3ForCausalLM, seeded) and written
with save_pretrained: nothing is downloaded. Norm weights are perturbed away from 1.0 and the
initialisation is wider than transformers' default so that logits are far from uniform and
greedy tokens are decided by clear margins.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.engines.lmc.build import BuildRecord, build_engine


@pytest.fixture(scope="session")
def engine_build() -> BuildRecord:
    """The x86_64 release build of lmc."""
    return build_engine(target="x86_64")


@pytest.fixture(scope="session")
def lmc(engine_build: BuildRecord) -> Path:
    return Path(engine_build.binary)


@pytest.fixture(scope="session")
def engine_build_aarch64() -> BuildRecord:
    return build_engine(target="aarch64")


@pytest.fixture(scope="session")
def lmc_asan() -> Path:
    """lmc built with AddressSanitizer + UndefinedBehaviorSanitizer."""
    return Path(build_engine(target="x86_64", variant="asan").binary)


QEMU_AARCH64 = ["qemu-aarch64-static", "-cpu", "cortex-a76"]


def run_lmc(binary: Path | list[str], *args: str, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [str(binary)] if isinstance(binary, (str, Path)) else list(binary)
    return subprocess.run([*argv, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def lmc_json(binary: Path | list[str], *args: str, timeout: float = 300) -> dict:
    """Run lmc and parse its JSON, failing the test with lmc's stderr when it fails."""
    proc = run_lmc(binary, *args, timeout=timeout)
    assert proc.returncode == 0, f"lmc {' '.join(map(str, args))} failed: {proc.stderr}"
    return json.loads(proc.stdout)


# ---------------------------------------------------------------------------------------------
# Tiny Qwen3 models
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinySpec:
    """One small random Qwen3 configuration."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    dtype: str  # "float32" | "bfloat16": the dtype of the safetensors file
    old_config_form: bool = False  # top-level rope_theta / torch_dtype instead of rope_parameters
    vocab: int = 320
    layers: int = 2
    intermediate: int = 160
    rope_theta: float = 10000.0
    seed: int = 0


TINY_SPECS = {
    # GQA ratio 1, head_dim == hidden / heads, tied embeddings, F32
    "gqa1_tied_f32": TinySpec("gqa1_tied_f32", hidden=64, heads=4, kv_heads=4, head_dim=16,
                              tied=True, dtype="float32", seed=1),
    # GQA ratio 2, head_dim 24 != 64 / 4, untied, BF16 file
    "gqa2_untied_bf16": TinySpec("gqa2_untied_bf16", hidden=64, heads=4, kv_heads=2, head_dim=24,
                                 tied=False, dtype="bfloat16", seed=2),
    # GQA ratio 4, head_dim 32 != 96 / 8, untied, F32, the pre-transformers-5 config form
    "gqa4_untied_f32_old": TinySpec("gqa4_untied_f32_old", hidden=96, heads=8, kv_heads=2,
                                    head_dim=32, tied=False, dtype="float32",
                                    old_config_form=True, rope_theta=1e6, seed=3),
    # widths that are not multiples of 8 or 32 (40, 72, 2 x 20): the kernels' tails and the
    # zero-padded q8 blocks; GQA ratio 2, untied, F32
    "odd_widths_f32": TinySpec("odd_widths_f32", hidden=40, heads=2, kv_heads=1, head_dim=20,
                               tied=False, dtype="float32", intermediate=72, seed=5),
    # the packed weight layout's edges: bf16's 16-column blocks then one 8-column block (40;
    # 70 -> 64 + a 6-column tail), rows % 4 remainders (70 rows; a vocabulary of 318 in the
    # tied lm_head, whose rows are also the embeddings); BF16 file
    "odd_widths_tied_bf16": TinySpec("odd_widths_tied_bf16", hidden=40, heads=2, kv_heads=1,
                                     head_dim=20, tied=True, dtype="bfloat16", intermediate=70,
                                     vocab=318, seed=6),
    # rows long enough for the q8 tile's 8-blocks-at-a-time step and for two column blocks of
    # a prefill panel: the down projection's 1100 columns are 34 whole blocks of 32 and a
    # zero-padded one (8 at a time 4 times, then 3 one by one), and a panel's blocks of 1024
    # (v3) or 512 (v4) columns and then 76 (64 in bf16's 16-column pairs, 8, a 4-column tail)
    "wide_mlp_f32": TinySpec("wide_mlp_f32", hidden=64, heads=4, kv_heads=2, head_dim=16,
                             tied=False, dtype="float32", intermediate=1100, seed=7),
}


def build_tiny_model(spec: TinySpec, out_dir: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen3Config(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, max_position_embeddings=512,
        rms_norm_eps=1e-6, tie_word_embeddings=spec.tied, initializer_range=0.2,
        rope_theta=spec.rope_theta, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
    if spec.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if spec.old_config_form:
        params = cfg.pop("rope_parameters", None) or {}
        cfg["rope_theta"] = params.get("rope_theta", spec.rope_theta)
        cfg["torch_dtype"] = cfg.pop("dtype", spec.dtype)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    """tiny_model(name) -> directory of that TINY_SPECS model (built once per session)."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_tiny_model(TINY_SPECS[name], tmp_path_factory.mktemp(name))
        return built[name]

    return get


def hf_reference(model_dir: Path, ids: list[int], max_new: int):
    """transformers' prompt logits (float32) and greedy continuation for ``ids``."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        prompt = torch.tensor([ids])
        logits = model(prompt).logits[0].numpy()
        out = model.generate(prompt, max_new_tokens=max_new, min_new_tokens=max_new,
                             do_sample=False)
    return logits, out[0, len(ids):].tolist()


# the model the error tests break
BROKEN_MODEL = "gqa2_untied_bf16"


@pytest.fixture
def broken(tiny_model, tmp_path: Path) -> Path:
    """A writable copy of the BROKEN_MODEL tiny model; edit it to break it."""
    target = tmp_path / "model"
    shutil.copytree(tiny_model(BROKEN_MODEL), target)
    return target


@pytest.fixture
def prompt(tmp_path: Path) -> Path:
    """A four-token prompt file."""
    return write_tokens(tmp_path / "prompt.txt", [1, 2, 3, 4])


def write_tokens(path: Path, ids: list[int]) -> Path:
    path.write_text(" ".join(map(str, ids)) + "\n")
    return path


# ---- lmc's refusals, as the error tests (engine, hostile inputs) check them ------------------


def assert_input_error(proc, expected: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode}, stderr: {proc.stderr}"
    assert len(lines) == 1, f"expected one stderr line, got: {proc.stderr}"
    assert lines[0].startswith("lmc: error: ")
    assert expected in lines[0], f"{expected!r} not in {lines[0]!r}"
    assert proc.stdout == ""


def generate(lmc_asan, model, prompt, *extra):
    return run_lmc(lmc_asan, "generate", "--model", model, "--prompt", prompt, "--max-new", 2,
                   *extra)


def edit_config(model, edit) -> None:
    path = model / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
