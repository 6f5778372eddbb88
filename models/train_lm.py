"""Train the small Qwen3 language model shipped in models/pydoc-lm (torch on CPU).

Data: the reStructuredText sources of the Python 3.11 documentation as Debian packages them
(``python3.11-doc``: /usr/share/doc/python3.11/html/_sources/**/*.rst.txt; `bash scripts/setup.sh
train` installs it). A fixed 5 % of the files (chosen by a hash of their path) is held out: the
model never sees them, and the first of them, in path order, become ``heldout.txt`` (the text the
perplexity workloads read). Tokenizer: byte-level BPE trained here on the training files with
``tokenizers`` (Qwen-style pre-splitting, so decoding gives back the exact bytes).

Plain next-token loss on random windows of the concatenated training files (documents separated
by <|endoftext|>): 512-token windows first, 2048-token windows for the last part of the run, so
that perplexity at 512/1024/2048 is measured at lengths the model has seen. With
--copy-fraction, that share of the windows repeats a span further on, to reward reading far back.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python models/train_lm.py --minutes 30   # stopped at step 100
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python models/train_lm.py --minutes 36 --copy-fraction 0.5

(the two phases that produced models/pydoc-lm; its README has the figures). Resumable: a
checkpoint is written to --ckpt at every evaluation; rerunning continues from it, with the
tokenizer already in --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))

from needle_tokenizer import SPECIAL_TOKENS, pre_tokenizer, save_tokenizer  # noqa: E402
from train_needle import lr_at, model_config, progress_at, save_model  # noqa: E402

DEBIAN_PACKAGE = "python3.11-doc"
SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
# Qwen's splitting: contractions, words with one leading non-letter, single digits, runs of
# punctuation (rst underlines stay one pre-token), newlines, spaces.
LM_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
HELDOUT_EVERY = 20  # one file in 20 is held out
HELDOUT_CHARS = 160_000  # how much held-out text ships as heldout.txt
TOKENS_PER_BATCH = 8192


def is_held_out(relative: str) -> bool:
    return int(hashlib.sha256(relative.encode()).hexdigest()[:8], 16) % HELDOUT_EVERY == 0


def read_corpus(root: Path) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts), each in path order."""
    files = sorted(root.rglob("*.txt"))
    if not files:
        raise SystemExit(f"no documentation sources under {root}: install {DEBIAN_PACKAGE} "
                         f"(bash scripts/setup.sh train)")
    train, held = [], []
    for path in files:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            (held if is_held_out(str(path.relative_to(root))) else train).append(text)
    return train, held


def package_version() -> str:
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", DEBIAN_PACKAGE],
                          capture_output=True, text=True, check=True).stdout


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer(LM_SPLIT)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def held_out_text(texts: list[str]) -> str:
    """The first held-out files, whole, up to about HELDOUT_CHARS characters."""
    chosen, used = [], 0
    for text in texts:
        if used >= HELDOUT_CHARS:
            break
        chosen.append(text)
        used += len(text)
    return "\n\n".join(chosen) + "\n"


def encode_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    eot = tokenizer.token_to_id(SPECIAL_TOKENS[0])
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids += encoding.ids + [eot]
    return torch.tensor(ids, dtype=torch.long)


def batch(stream: torch.Tensor, length: int, rng: random.Random,
          copy_fraction: float = 0.0) -> torch.Tensor:
    """Random windows of ``length + 1`` ids; in ``copy_fraction`` of them a span of 16-96 ids is
    written again further on (at any distance), so that copying from far back pays off."""
    size = max(1, TOKENS_PER_BATCH // length)
    starts = [rng.randrange(len(stream) - length - 1) for _ in range(size)]
    rows = torch.stack([stream[s:s + length + 1] for s in starts])
    for row in rows:
        if rng.random() < copy_fraction:
            span = rng.randint(16, min(96, length // 4))
            source = rng.randrange(length + 1 - 2 * span)
            target = rng.randint(source + span, length + 1 - span)
            row[target:target + span] = row[source:source + span].clone()
    return rows


@torch.no_grad()
def held_out_nll(model: Qwen3ForCausalLM, ids: torch.Tensor, length: int) -> float:
    """Mean next-token nll over the non-overlapping ``length``-token windows of ``ids``."""
    model.eval()
    windows = ids[: len(ids) // length * length].view(-1, length)
    total = 0.0
    for row in windows:
        logits = model(input_ids=row[None, :-1]).logits[0]
        total += F.cross_entropy(logits, row[1:]).item()
    model.train()
    return total / len(windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "pydoc-lm")
    parser.add_argument("--sources", type=Path, default=SOURCES)
    parser.add_argument("--ckpt", type=Path, default=Path("/tmp/pydoc-lm-train.pt"))
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="time budget: progress follows the clock if it runs out first")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--short", type=int, default=512, help="window length early on")
    parser.add_argument("--long", type=int, default=2048, help="window length late in the run")
    parser.add_argument("--long-from", type=float, default=0.75,
                        help="progress from which windows are --long tokens")
    parser.add_argument("--copy-fraction", type=float, default=0.0,
                        help="share of training windows with a span repeated further on")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_texts, held_texts = read_corpus(args.sources)
    if args.ckpt.exists() and (args.out / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(args.out / "tokenizer.json"))  # resuming: keep ids
    else:
        tokenizer = train_tokenizer(train_texts, args.vocab)
        save_tokenizer(tokenizer, args.out, unk_token=None)
    heldout = held_out_text(held_texts)
    (args.out / "heldout.txt").write_text(heldout)
    stream = encode_stream(tokenizer, train_texts)
    held_ids = torch.tensor(tokenizer.encode(heldout).ids[:4 * args.long], dtype=torch.long)
    print(f"{DEBIAN_PACKAGE} {package_version()}: {len(train_texts)} training files "
          f"({len(stream)} tokens), {len(held_texts)} held out ({len(heldout)} characters "
          f"shipped); vocabulary {tokenizer.get_vocab_size()}", flush=True)

    config = model_config(tokenizer.get_vocab_size(), 8192, args.layers, args.heads,
                          args.kv_heads, args.head_dim, args.hidden, args.intermediate)
    config.eos_token_id = tokenizer.token_to_id(SPECIAL_TOKENS[2])
    model = Qwen3ForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    others = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1},
                                   {"params": others, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    rng = random.Random(args.seed)
    step, elapsed = 0, 0.0
    if args.ckpt.exists():
        state = torch.load(args.ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
        rng.setstate(state["rng"])
        print(f"resumed at step {step} ({elapsed / 60:.1f} min)", flush=True)
    print(f"parameters: {sum(p.numel() for p in model.parameters())}", flush=True)
    model.train()
    started, seen = time.time() - elapsed, 0
    while (fraction := progress_at(step, args.steps, time.time() - started, args.minutes)) < 1:
        length = args.long if fraction >= args.long_from else args.short
        ids = batch(stream, length, rng, args.copy_fraction)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, fraction, args.lr, args.warmup)
        logits = model(input_ids=ids[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step, seen = step + 1, seen + ids[:, 1:].numel()
        if step % 10 == 0:
            print(f"step {step} len {length} loss {loss.item():.3f} tokens {seen} "
                  f"min {(time.time() - started) / 60:.1f}", flush=True)
        last = progress_at(step, args.steps, time.time() - started, args.minutes) >= 1
        if step % args.eval_every == 0 or last:
            save_model(model, args.out)
            nll = held_out_nll(model, held_ids, 512)
            print(f"step {step} held-out nll@512 {nll:.3f} ppl {math.exp(nll):.1f}", flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step, "elapsed": time.time() - started,
                        "rng": rng.getstate()}, args.ckpt)
    record = {"package": DEBIAN_PACKAGE, "package_version": package_version(),
              "sources": str(args.sources), "training_files": len(train_texts),
              "held_out_files": len(held_texts), "training_tokens": len(stream),
              "steps": step, "minutes": round((time.time() - started) / 60, 1),
              "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"done: {step} steps in {record['minutes']} min", flush=True)


if __name__ == "__main__":
    main()
