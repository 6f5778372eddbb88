"""Workloads: token-id prompts for the engine (needle, perplexity, decode) and answer checking.

The public API other parts call; see ``prompts`` for the generators, ``tokenizer`` for how a
model directory's tokenizer and chat template are used, ``text`` for the filler and needles.
"""

from harness.workloads.prompts import (
    NeedlePrompt,
    TokenStream,
    answer_text,
    check_answer,
    decode_prompt,
    fill_sentences,
    ids_hash,
    ids_text,
    needle_prompt,
    ppl_tokens,
)
from harness.workloads.text import DEFAULT_NEEDLE, GrammarFiller, NeedleTemplate, TextFiller
from harness.workloads.tokenizer import ChatRender, ModelTokenizer, load_tokenizer

__all__ = [
    "DEFAULT_NEEDLE", "ChatRender", "GrammarFiller", "ModelTokenizer", "NeedlePrompt",
    "NeedleTemplate", "TextFiller", "TokenStream", "answer_text", "check_answer",
    "decode_prompt", "fill_sentences", "ids_hash", "ids_text", "load_tokenizer", "needle_prompt",
    "ppl_tokens",
]
