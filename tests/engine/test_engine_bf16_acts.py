"""`lmc generate --wq bf16 --bf16-acts`: every weight product takes its activations rounded to
bfloat16, as llama.cpp's bf16 products do (at x86-64-v4 with AVX512_BF16 the prefill panels
are vdpbf16ps, two products a lane in one instruction).

The independent reference is transformers with a hook on every linear layer that rounds the
layer's input to bfloat16: the same products, computed by torch. The option's other promises:
a prompt's logits do not depend on how prefill batches it (chunks against token by token),
it changes the output (it is not a no-op), and it is refused without bf16 weights.
"""

from __future__ import annotations

import numpy as np
from fixtures_engine import TINY_SPECS, assert_input_error, run_lmc, write_tokens
from test_engine_model import generate, prompt_ids, rel_err

MODEL = "odd_widths_tied_bf16"  # widths 40 and 70: 16-column steps, an 8-column block, tails


def transformers_with_rounded_inputs(model_dir, ids: list[int]) -> np.ndarray:
    """transformers' prompt logits (float32) with every nn.Linear's input rounded to bf16."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def round_input(_module, args):
        return (args[0].to(torch.bfloat16).to(torch.float32), *args[1:])

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 * model.config.num_hidden_layers + 1  # q k v o gate up down, head
    for module in linears:
        module.register_forward_pre_hook(round_input)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def test_bf16_acts_matches_transformers_with_rounded_inputs(lmc, tiny_model, tmp_path):
    spec = TINY_SPECS[MODEL]
    model = tiny_model(MODEL)
    ids = prompt_ids(spec.vocab, n=70)
    prompt = write_tokens(tmp_path / "prompt.txt", ids)
    out, logits = generate(lmc, model, prompt, tmp_path, "--wq", "bf16", "--bf16-acts",
                           "--threads", "2", tag="acts")
    assert out["config"]["wq"] == "bf16" and out["config"]["bf16_acts"] is True
    logits = logits[:len(ids) * spec.vocab].reshape(len(ids), spec.vocab)
    reference = transformers_with_rounded_inputs(model, ids)
    assert rel_err(logits, reference) < 1e-4
    # not a no-op: the products with f32 activations differ, by about bf16's rounding
    plain_out, plain = generate(lmc, model, prompt, tmp_path, "--wq", "bf16", tag="plain")
    assert plain_out["config"]["bf16_acts"] is False
    plain = plain[:len(ids) * spec.vocab].reshape(len(ids), spec.vocab)
    assert 1e-4 < rel_err(plain, reference) < 0.03
    assert rel_err(plain, logits) > 1e-4


def test_bf16_acts_prefill_chunks_give_token_by_token_bits(lmc, tiny_model, tmp_path):
    """70 tokens run as chunks of 64 + 6 (the prefill panels; vdpbf16ps at v4-vnni) and one
    token at a time (--dump-features: decode's one-token tiles, FMAs on the rounded values)."""
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "prompt.txt", prompt_ids(TINY_SPECS[MODEL].vocab, n=70))
    options = ("--wq", "bf16", "--bf16-acts")
    _, chunked = generate(lmc, model, prompt, tmp_path, *options, tag="chunked")
    _, single = generate(lmc, model, prompt, tmp_path, *options, "--dump-features",
                         tmp_path / "features.bin", tag="single")
    assert (tmp_path / "features.bin").stat().st_size > 0  # the token-by-token runner ran
    n = 70 * TINY_SPECS[MODEL].vocab
    assert chunked[:n].tobytes() == single[:n].tobytes()


def test_bf16_acts_needs_bf16_weights(lmc, tiny_model, tmp_path):
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "prompt.txt", [1, 2, 3])
    for wq in ("f32", "q8"):
        proc = run_lmc(lmc, "generate", "--model", model, "--prompt", prompt, "--wq", wq,
                       "--bf16-acts")
        assert_input_error(proc, f"--bf16-acts rounds the activations of bf16 weight products: "
                                 f"it needs --wq bf16 (got --wq {wq})")
