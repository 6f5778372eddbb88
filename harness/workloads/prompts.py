"""The workloads: needle prompts, held-out perplexity streams and decode prompts, as token ids.

Every generator is deterministic in its arguments. Prompts are built as text, rendered with the
model's chat template and tokenised once as a whole, so the ids are exactly what Hugging Face's
``apply_chat_template(..., add_generation_prompt=True)`` would produce; the needle's token span is
found from the tokenizer's character offsets, whatever the tokenizer is.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from devices.files import read_text
from harness.errors import InputError
from harness.workloads.text import (
    DECODE_REQUEST,
    DEFAULT_NEEDLE,
    GrammarFiller,
    NeedleTemplate,
    TextFiller,
    resolve_filler,
)
from harness.workloads.tokenizer import ModelTokenizer, load_tokenizer

# How many further sentences are tried to top up the last few tokens of a haystack.
_TOP_UP_TRIES = 64


def ids_hash(ids: list[int]) -> str:
    """sha256 of the ids written as decimal integers separated by single spaces (lmc's format)."""
    return hashlib.sha256(" ".join(map(str, ids)).encode()).hexdigest()


def ids_text(ids: list[int]) -> str:
    """The ids as an lmc ``--prompt`` / ``--text`` file body."""
    return " ".join(map(str, ids)) + "\n"


@dataclass
class NeedlePrompt:
    ids: list[int]
    answer: str
    needle_span: tuple[int, int]  # [start, end) token indices of the needle sentence in ids
    hash: str
    ctx: int
    depth: float
    seed: int
    key: str
    stop_ids: list[int]

    def to_dict(self) -> dict:
        record = asdict(self)
        record["needle_span"] = list(self.needle_span)
        return record


@dataclass
class TokenStream:
    kind: str  # "ppl" or "decode"
    ids: list[int]
    hash: str
    length: int
    seed: int
    stop_ids: list[int]

    def to_dict(self) -> dict:
        return asdict(self)


def _tokenizer(model: str | Path | ModelTokenizer) -> ModelTokenizer:
    return model if isinstance(model, ModelTokenizer) else load_tokenizer(model)


def _check_length(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")


def fill_sentences(tok: ModelTokenizer, budget: int, sentences: Iterator[str]) -> list[str]:
    """Sentences from ``sentences`` whose tokens add up to at most ``budget`` (as close as the
    stream allows: when the next sentence does not fit, later ones are tried to top it up)."""
    chosen: list[str] = []
    used, misses = 0, 0
    for sentence in sentences:
        cost = len(tok.encode(" " + sentence))
        if used + cost <= budget:
            chosen.append(sentence)
            used += cost
            misses = 0 if used < budget else _TOP_UP_TRIES
        else:
            misses += 1
        if misses >= _TOP_UP_TRIES:
            break
    return chosen


@dataclass
class _UserTurn:
    ids: list[int]
    offsets: list[tuple[int, int]]
    content_start: int  # character offset of the user content in the rendered text
    text: str


def _render_user_turn(tok: ModelTokenizer, content: str) -> _UserTurn:
    render = tok.render_chat([{"role": "user", "content": content}], add_generation_prompt=True)
    ids, offsets = tok.encode_with_offsets(render.text)
    return _UserTurn(ids=ids, offsets=offsets, content_start=render.content_spans[0][0],
                     text=render.text)


def _haystack_turn(tok: ModelTokenizer, ctx: int, sentences: Iterator[str], tail: str,
                   insert: str | None = None, depth: float = 0.0,
                   what: str = "prompt") -> tuple[_UserTurn, int]:
    """A user turn of at most ``ctx`` tokens: filler sentences (with ``insert`` placed at the
    sentence boundary nearest ``depth``), a blank line, then ``tail``. Returns the turn and the
    character offset of ``insert`` in the rendered text (-1 without one)."""
    core = f"{insert}\n\n{tail}" if insert else tail
    base = len(_render_user_turn(tok, core).ids)
    if base > ctx:
        raise InputError(f"ctx {ctx} is too small for the {what}: the chat template, "
                         f"{'needle and ' if insert else ''}question alone take {base} tokens")
    filler = fill_sentences(tok, ctx - base, sentences)
    while True:
        costs = [len(tok.encode(" " + s)) for s in filler]
        bounds = [sum(costs[:i]) for i in range(len(filler) + 1)]
        at = min(range(len(bounds)), key=lambda i: (abs(bounds[i] - depth * bounds[-1]), i))
        parts = filler[:at] + ([insert] if insert else []) + filler[at:]
        body = " ".join(parts)
        content = f"{body}\n\n{tail}" if body else tail
        turn = _render_user_turn(tok, content)
        if len(turn.ids) <= ctx or not filler:
            break
        # Tokens can merge across sentence joins; drop filler until the whole fits.
        filler = filler[:-1]
    insert_at = -1
    if insert:
        insert_at = turn.content_start + len(" ".join(filler[:at] + [""]))
    return turn, insert_at


def _token_span(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """[first, last + 1) of the tokens whose characters overlap [start, end)."""
    inside = [i for i, (a, b) in enumerate(offsets) if a < end and b > start and b > a]
    return inside[0], inside[-1] + 1


def needle_prompt(model_dir: str | Path | ModelTokenizer, ctx: int, depth: float, seed: int,
                  filler: str | GrammarFiller | TextFiller = "grammar",
                  needle_template: NeedleTemplate = DEFAULT_NEEDLE) -> NeedlePrompt:
    """A chat prompt of about ``ctx`` tokens (at most ``ctx``, short by less than one filler
    sentence) hiding one needle at fractional ``depth`` of the haystack, asking for its value.

    The seed fixes the key, the value and the filler stream, so prompts of one seed at different
    lengths and depths share their needle and the start of their haystack.
    """
    _check_length("ctx", ctx)
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        raise InputError(f"depth must be a number in [0, 1], got {depth!r}")
    _check_length("seed", seed, minimum=0)
    tok = _tokenizer(model_dir)
    key, value = needle_template.draw(random.Random(f"needle/{seed}"))
    needle = needle_template.needle_text(key, value)
    sentences = resolve_filler(filler).sentences(random.Random(f"filler/{seed}"))
    turn, needle_at = _haystack_turn(tok, ctx, sentences, needle_template.question_text(key),
                                     insert=needle, depth=float(depth), what="needle prompt")
    span = _token_span(turn.offsets, needle_at, needle_at + len(needle))
    return NeedlePrompt(ids=turn.ids, answer=value, needle_span=span, hash=ids_hash(turn.ids),
                        ctx=ctx, depth=float(depth), seed=seed, key=key, stop_ids=tok.stop_ids)


def ppl_tokens(model_dir: str | Path | ModelTokenizer, length: int, seed: int,
               filler: str | GrammarFiller | TextFiller = "grammar",
               text: str | Path | None = None) -> TokenStream:
    """Exactly ``length`` ids of plain prose (no chat template) for teacher-forced perplexity.

    With ``text`` (a UTF-8 file, e.g. a model's held-out text), the file is tokenised as a whole
    and seed ``s`` takes its ``s``-th window of ``length`` ids (windows do not overlap). Without
    it, the ids come from the filler's ``ppl/<seed>`` stream, which training never used (it draws
    from integer-seeded generators), so the text is held out although it comes from the same
    grammar.
    """
    _check_length("length", length, minimum=2)
    _check_length("seed", seed, minimum=0)
    tok = _tokenizer(model_dir)
    if text is not None:
        ids = _text_window(tok, Path(text), length, seed)
    else:
        sentences = resolve_filler(filler).sentences(random.Random(f"ppl/{seed}"))
        prose, ids = "", []
        while len(ids) < length:
            chunk = " ".join(next(sentences) for _ in range(64))
            prose = f"{prose} {chunk}" if prose else chunk
            ids = tok.encode(prose)
        ids = ids[:length]
    return TokenStream(kind="ppl", ids=ids, hash=ids_hash(ids), length=length, seed=seed,
                       stop_ids=tok.stop_ids)


def _text_window(tok: ModelTokenizer, path: Path, length: int, seed: int) -> list[int]:
    try:
        ids = tok.encode(read_text(path))
    except OSError as exc:
        raise InputError(f"ppl text {path}: cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"ppl text {path}: cannot read it as UTF-8 text ({exc})") from exc
    windows = len(ids) // length
    if seed >= windows:
        raise InputError(f"ppl text {path}: {len(ids)} tokens hold {windows} windows of "
                         f"{length} tokens (seeds 0-{windows - 1}); seed {seed} needs "
                         f"{(seed + 1) * length}")
    return ids[seed * length:(seed + 1) * length]


def decode_prompt(model_dir: str | Path | ModelTokenizer, ctx: int, seed: int,
                  filler: str | GrammarFiller | TextFiller = "grammar") -> TokenStream:
    """A chat prompt of about ``ctx`` tokens (filler then a request) for pure speed runs."""
    _check_length("ctx", ctx)
    _check_length("seed", seed, minimum=0)
    tok = _tokenizer(model_dir)
    sentences = resolve_filler(filler).sentences(random.Random(f"decode/{seed}"))
    turn, _ = _haystack_turn(tok, ctx, sentences, DECODE_REQUEST, what="decode prompt")
    return TokenStream(kind="decode", ids=turn.ids, hash=ids_hash(turn.ids), length=len(turn.ids),
                       seed=seed, stop_ids=tok.stop_ids)


def answer_text(model_dir_or_tokenizer: str | Path | ModelTokenizer,
                generated_ids: list[int]) -> str:
    """The decoded assistant answer: generated ids up to the first stop token."""
    tok = _tokenizer(model_dir_or_tokenizer)
    ids = list(generated_ids)
    for i, token in enumerate(ids):
        if token in tok.stop_ids:
            ids = ids[:i]
            break
    return tok.decode(ids)


def check_answer(model_dir_or_tokenizer: str | Path | ModelTokenizer, generated_ids: list[int],
                 answer: str) -> bool:
    """Recall: the whole expected value appears in the decoded answer."""
    return answer in answer_text(model_dir_or_tokenizer, generated_ids)
