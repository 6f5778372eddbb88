"""Needle recall grids: context lengths x depths x seeds, answered by a generate function: lmc's
(``harness.engines.lmc.generator``) or transformers' (``transformers_generator``).

Used by bench/needle_grid.py (the full grid in the model card) and by the fast test subset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.workloads.prompts import check_answer, needle_prompt
from harness.workloads.tokenizer import load_tokenizer

# generate(ids, max_new, stop_id) -> generated ids
GenerateFn = Callable[[list[int], int, int], list[int]]
ANSWER_TOKENS = 24  # the needle model restates the needle sentence, then <|im_end|>


@dataclass
class GridCell:
    ctx: int
    depth: float
    seed: int
    prompt_tokens: int
    needle_span: tuple[int, int]
    answer: str
    generated: list[int]
    found: bool


def transformers_generator(model_dir: str | Path) -> GenerateFn:
    """Greedy generation by transformers (the numerical reference; needs torch)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()

    def generate(ids: list[int], max_new: int, stop_id: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=stop_id, pad_token_id=stop_id)
        return out[0, len(ids):].tolist()

    return generate


def recall_grid(generate: GenerateFn, model_dir: str | Path, ctxs: Sequence[int],
                depths: Sequence[float], seeds: Sequence[int],
                progress: Callable[[GridCell], None] | None = None) -> list[GridCell]:
    tok = load_tokenizer(model_dir)
    cells = []
    for ctx in ctxs:
        for depth in depths:
            for seed in seeds:
                prompt = needle_prompt(tok, ctx, depth, seed)
                generated = generate(prompt.ids, ANSWER_TOKENS, tok.im_end_id)
                cell = GridCell(ctx=ctx, depth=depth, seed=seed, prompt_tokens=len(prompt.ids),
                                needle_span=prompt.needle_span, answer=prompt.answer,
                                generated=generated,
                                found=check_answer(tok, generated, prompt.answer))
                cells.append(cell)
                if progress:
                    progress(cell)
    return cells


def format_grid(cells: Sequence[GridCell]) -> str:
    """A markdown table: one row per context length, found/total per depth, and the recall."""
    ctxs = sorted({c.ctx for c in cells})
    depths = sorted({c.depth for c in cells})
    header = "| ctx | " + " | ".join(f"{d:g}" for d in depths) + " | recall |"
    lines = [header, "|" + "---|" * (len(depths) + 2)]
    for ctx in ctxs:
        row = [c for c in cells if c.ctx == ctx]
        counts = []
        for depth in depths:
            at = [c for c in row if c.depth == depth]
            counts.append(f"{sum(c.found for c in at)}/{len(at)}")
        recall = sum(c.found for c in row) / len(row)
        lines.append(f"| {ctx} | " + " | ".join(counts) + f" | {recall:.3f} |")
    return "\n".join(lines)
