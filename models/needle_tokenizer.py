"""Build the word-level tokenizer and Qwen-style chat template of the needle model.

Pre-tokenisation follows Qwen's scheme (a splitting regex, then byte-level mapping so that decode
gives back the exact text), but every pre-token is one vocabulary entry (WordLevel) instead of
being merged by BPE. Digits are single tokens, so a 5-digit code is 5 tokens.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from harness.workloads.text import DEFAULT_NEEDLE, DIGITS, KEYS, GrammarFiller, lexicon

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
UNK = "<unk>"
# Letters with an optional leading non-letter (space, apostrophe), single digits, single
# punctuation marks, runs of newlines, runs of spaces.
SPLIT_PATTERN = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|[^\s\p{L}\p{N}]|\s*[\r\n]+|\s+(?!\S)|\s+"
PUNCTUATION = ".,?!;:'\"-()"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('roles must be system, user or assistant') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def pre_tokenizer(pattern: str = SPLIT_PATTERN) -> pre_tokenizers.PreTokenizer:
    """Split by ``pattern``, then map bytes to printable characters (exact round trips)."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _sample_texts(count: int) -> list[str]:
    """Rendered-looking conversations covering every way the prompts join words."""
    rng = random.Random(1234)
    sentences = GrammarFiller().sentences(rng)
    texts = []
    for _ in range(count):
        key, value = DEFAULT_NEEDLE.draw(rng)
        filler = [next(sentences) for _ in range(6)]
        body = " ".join([*filler, DEFAULT_NEEDLE.needle_text(key, value)])
        texts.append(f"system\nuser\n{body}\n\n{DEFAULT_NEEDLE.question_text(key)}\nassistant\n"
                     f"{value}\n{body}.\n")
    return texts


def build_tokenizer() -> Tokenizer:
    pre = pre_tokenizer()
    pieces: set[str] = set()
    for word in [*lexicon(), *KEYS, "system", "user", "assistant"]:
        for form in (word, " " + word):
            pieces.update(p for p, _ in pre.pre_tokenize_str(form))
    for text in [*DIGITS, *PUNCTUATION, " ", "  ", "\n", "\n\n", *_sample_texts(200)]:
        pieces.update(p for p, _ in pre.pre_tokenize_str(text))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, UNK, *sorted(pieces)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def write_tokenizer(out_dir: Path) -> Tokenizer:
    return save_tokenizer(build_tokenizer(), out_dir, unk_token=UNK)


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path, unk_token: str | None) -> Tokenizer:
    """Write ``tokenizer.json`` and a ``tokenizer_config.json`` with the Qwen-style chat
    template and special tokens, as transformers' ``AutoTokenizer`` reads them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": unk_token,
        "bos_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


if __name__ == "__main__":
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "needle-tiny")
    print(f"vocabulary: {write_tokenizer(target).get_vocab_size()} tokens -> {target}")
