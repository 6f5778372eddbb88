"""Tiny random models of the architectures lmc runs besides Qwen3, with their
transformers reference.

Each is made here with transformers (seeded, nothing downloaded) and written with
save_pretrained, so the checkpoint's tensor names and config.json are what transformers writes:
- ``llama``: LlamaForCausalLM, no q/k norm, untied, BF16 file;
- ``llama3_rope``: the same with Llama 3's "llama3" RoPE scaling, original context 64, so the
  test positions cross all three frequency bands (kept, interpolated, slowed);
- ``qwen3_vl``: Qwen3VLForConditionalGeneration (text tower + a one-block vision tower),
  tied, saved in 16 shards (model.safetensors.index.json);
- ``minicpm``: transformers has no MiniCPM (1/2) class (only MiniCPM3, whose attention is
  multi-head latent attention), so the reference is LlamaForCausalLM with MiniCPM's three
  factors applied by forward hooks where MiniCPM's modelling code applies them (embeddings
  times scale_emb, each residual branch times scale_depth / sqrt(layers), the final hidden
  state divided by hidden_size / dim_model_base), and config.json rewritten as MiniCPM's.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class ArchSpec:
    name: str
    kind: str  # "llama" | "qwen3_vl" | "minicpm"
    tied: bool
    dtype: str = "float32"  # of the safetensors file
    rope: dict | None = None  # rope_parameters beyond theta
    shard_size: str | None = None  # save_pretrained's max_shard_size
    seed: int = 0
    vocab: int = 320


MINICPM = {"scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 16}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

ARCH_SPECS = {
    "llama": ArchSpec("llama", "llama", tied=False, dtype="bfloat16", seed=11),
    "llama3_rope": ArchSpec("llama3_rope", "llama", tied=False, rope=LLAMA3_ROPE, seed=12),
    "qwen3_vl": ArchSpec("qwen3_vl", "qwen3_vl", tied=True, shard_size="40KB", seed=13),
    "minicpm": ArchSpec("minicpm", "minicpm", tied=True, seed=14),
}

TEXT = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.2,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _llama(spec: ArchSpec):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "default", "rope_theta": 500000.0, **(spec.rope or {})}
    config = LlamaConfig(**TEXT, tie_word_embeddings=spec.tied, rope_parameters=rope)
    return LlamaForCausalLM(config)


def _qwen3_vl(spec: ArchSpec):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    # mrope_section sums to head_dim / 2: on text-only input every section has the same position
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
            "mrope_interleaved": True}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                  deepstack_visual_indexes=[0], num_position_embeddings=16)
    config = Qwen3VLConfig(text_config={**TEXT, "rope_parameters": rope,
                                        "tie_word_embeddings": spec.tied},
                           vision_config=vision, tie_word_embeddings=spec.tied,
                           image_token_id=319, video_token_id=318, vision_start_token_id=317,
                           vision_end_token_id=316)
    return Qwen3VLForConditionalGeneration(config)


def add_minicpm_hooks(model, n_layers: int, hidden: int) -> None:
    """MiniCPM's factors on a LlamaForCausalLM, where MiniCPM's forward applies them."""
    residual = MINICPM["scale_depth"] / math.sqrt(n_layers)
    logit_div = hidden / MINICPM["dim_model_base"]
    model.model.embed_tokens.register_forward_hook(lambda m, i, out: out * MINICPM["scale_emb"])
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(lambda m, i, out: (out[0] * residual, *out[1:]))
        layer.mlp.register_forward_hook(lambda m, i, out: out * residual)
    model.lm_head.register_forward_pre_hook(lambda m, args: (args[0] / logit_div, *args[1:]))


def build_arch_model(spec: ArchSpec, out_dir: Path):
    """Write the model to out_dir; return the transformers reference (float32, eval)."""
    import torch

    torch.manual_seed(spec.seed)
    model = (_qwen3_vl if spec.kind == "qwen3_vl" else _llama)(spec).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            if spec.dtype == "bfloat16":  # the reference runs the file's values in float32
                param.copy_(param.to(torch.bfloat16).to(torch.float32))
    # a copy: Module.to converts in place, buffers too (the RoPE frequencies must stay f32)
    saved = copy.deepcopy(model).to(torch.bfloat16) if spec.dtype == "bfloat16" else model
    kwargs = {"max_shard_size": spec.shard_size} if spec.shard_size else {}
    saved.save_pretrained(out_dir, **kwargs)
    if spec.kind == "minicpm":
        cfg_path = out_dir / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(MINICPM, model_type="minicpm", architectures=["MiniCPMForCausalLM"])
        cfg_path.write_text(json.dumps(cfg, indent=2))
        add_minicpm_hooks(model, TEXT["num_hidden_layers"], TEXT["hidden_size"])
    return model


@pytest.fixture(scope="session")
def arch_model(tmp_path_factory: pytest.TempPathFactory):
    """arch_model(name) -> (directory, transformers reference) of that ARCH_SPECS model."""
    built: dict[str, tuple[Path, object]] = {}

    def get(name: str):
        if name not in built:
            out = tmp_path_factory.mktemp(name)
            built[name] = (out, build_arch_model(ARCH_SPECS[name], out))
        return built[name]

    return get


def reference_run(model, ids: list[int], max_new: int):
    """transformers' prompt logits, greedy continuation and mean nll (teacher forcing)."""
    import torch

    with torch.no_grad():
        prompt = torch.tensor([ids])
        out = model(prompt, labels=prompt)
        tokens = model.generate(prompt, max_new_tokens=max_new, min_new_tokens=max_new,
                                do_sample=False)
    return out.logits[0].float().numpy(), tokens[0, len(ids):].tolist(), out.loss.item()
