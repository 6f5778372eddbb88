"""Train the needle-retrieval Qwen3 model shipped in models/needle-tiny (torch on CPU).

Task: multi-query associative recall in chat form. Each training conversation hides several
"The secret code of <name> is <5 digits>." needles at random sentence boundaries of a filler
haystack (the same grammar the workloads use), then asks for every code, one per turn; the first
question sits after the haystack inside the user turn, exactly as in the needle workload. The
assistant answers by restating the needle sentence (so the value is copied after the same words
as in the haystack). The loss is on the answer tokens and their <|im_end|> (plus a small
language-modelling weight on everything else, so perplexity runs measure something). Lengths
follow a curriculum up to the longest context the model must serve.

    OMP_WAIT_POLICY=PASSIVE nice .venv/bin/python models/train_needle.py --out DIR \
        --qk-gain 1.0 --needle-counts 1 --longest 160 --lm-weight 0 --minutes 14   # then
    ... --needle-counts 1,1,1,2 --longest 2304 --lm-weight 0 --stage 0 --minutes 16.1

(the two phases that produced models/needle-tiny; see its README for the exact history).
Single needles in short contexts first: mixed needle counts in long contexts stayed on the
loss plateau for thousands of steps.

Resumable: a checkpoint (weights + optimiser + step + random state) is written to --ckpt at every
evaluation; rerunning the same command continues from it.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from needle_tokenizer import write_tokenizer  # noqa: E402

from harness.workloads import (  # noqa: E402
    DEFAULT_NEEDLE,
    GrammarFiller,
    ModelTokenizer,
    check_answer,
    load_tokenizer,
    needle_prompt,
)
from harness.workloads.grid import ANSWER_TOKENS  # noqa: E402
from harness.workloads.text import KEYS  # noqa: E402

LM_WEIGHT = 0.1  # loss weight of non-answer tokens
TOKENS_PER_BATCH = 8192
MIN_LEN = 96
# Qwen3 RMS-normalises q and k per head, so with unit gains an attention logit can never exceed
# sqrt(head_dim) (8 at head_dim 64, 5.7 at 32): too flat to single out one needle among
# thousands of tokens. A gain of 1.5 raises that cap 2.25-fold; the optimiser can go further.
QK_NORM_GAIN = 1.5


def model_config(vocab_size: int, max_len: int, layers: int = 2, heads: int = 2,
                 kv_heads: int = 1, head_dim: int = 64, hidden: int = 128,
                 intermediate: int = 512) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=-(-vocab_size // 64) * 64, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_len, rope_parameters={"rope_type": "default",
                                                          "rope_theta": 10_000.0},
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
        bos_token_id=None, eos_token_id=2, pad_token_id=0,
    )


class ConversationSampler:
    """Random multi-needle conversations as (ids, per-target loss weights)."""

    def __init__(self, tok: ModelTokenizer, rng: random.Random,
                 needle_counts: tuple[int, ...] = (1, 1, 2, 4, 8)):
        self.tok, self.rng, self.needle_counts = tok, rng, needle_counts
        self.lm_weight = LM_WEIGHT
        self.sentences = GrammarFiller().sentences(rng)
        self.cost: dict[str, int] = {}

    def _sentence(self) -> tuple[str, int]:
        sentence = next(self.sentences)
        if sentence not in self.cost:
            if len(self.cost) > 200_000:
                self.cost.clear()
            self.cost[sentence] = len(self.tok.encode(" " + sentence))
        return sentence, self.cost[sentence]

    def sample(self, length: int) -> tuple[list[int], list[float]]:
        rng = self.rng
        # Single needles teach plain copying; several teach finding the right one by its key.
        count = rng.choice(self.needle_counts)
        keys = rng.sample(KEYS, count)
        values = ["".join(rng.choice("0123456789") for _ in range(5)) for _ in keys]
        needles = [DEFAULT_NEEDLE.needle_text(k, v) for k, v in zip(keys, values, strict=True)]
        budget = length - 14 * count - 20 * count - 12
        filler, used = [], 0
        while used < budget:
            sentence, cost = self._sentence()
            filler.append(sentence)
            used += cost
        slots = [rng.randint(0, len(filler)) for _ in needles]
        if rng.random() < 0.2:
            slots[0] = 0
        if rng.random() < 0.2:
            slots[-1] = len(filler)
        parts = list(filler)
        for slot, needle in sorted(zip(slots, needles, strict=True), reverse=True):
            parts.insert(slot, needle)
        order = rng.sample(range(count), count)
        messages = []
        for turn, index in enumerate(order):
            question = DEFAULT_NEEDLE.question_text(keys[index])
            content = f"{' '.join(parts)}\n\n{question}" if turn == 0 else question
            # The answer restates the needle: the value then follows the same words as in the
            # haystack, which an induction circuit can copy (a bare value stayed at chance).
            messages += [{"role": "user", "content": content},
                         {"role": "assistant", "content": needles[index]}]
        render = self.tok.render_chat(messages, add_generation_prompt=False)
        ids, offsets = self.tok.encode_with_offsets(render.text)
        starts = [a for a, _ in offsets]
        weights = [self.lm_weight] * len(ids)
        for a, b in render.content_spans[1::2]:  # the assistant answers
            first, after = bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)
            # The answer's tokens and the <|im_end|> right after them.
            for i in range(first, min(after + 1, len(ids))):
                weights[i] = 1.0
        # weights[i] weighs predicting ids[i]; targets are ids[1:].
        return ids, weights[1:]


class Curriculum:
    """Context-length stages: move on when the answers are learnt at the current lengths
    (answer loss below ``ADVANCE_LOSS``), or at the latest when training progress forces it."""

    LIMITS = (320, 768, 1400)  # then the longest served length
    FORCED_AT = (0.45, 0.60, 0.72)  # progress at which each next stage starts regardless
    ADVANCE_LOSS = 0.2  # mean over answer tokens; about 0.5 nats per digit

    def __init__(self, longest: int, stage: int = 0):
        self.longest, self.stage = longest, stage

    def limit(self, progress: float) -> int:
        forced = sum(progress >= at for at in self.FORCED_AT)
        self.stage = max(self.stage, forced)
        limits = [*self.LIMITS, self.longest]
        return min(limits[self.stage], self.longest)

    def observe(self, answer_loss: float) -> None:
        if answer_loss < self.ADVANCE_LOSS and self.stage < len(self.LIMITS):
            self.stage += 1
            print(f"curriculum: stage {self.stage}, up to {self.limit(0.0)} tokens", flush=True)


def make_batch(sampler: ConversationSampler, limit: int):
    rng = sampler.rng
    # Half the batches at the current limit, the rest spread below it.
    length = limit if rng.random() < 0.5 else rng.randint(MIN_LEN, limit)
    size = max(1, min(16, TOKENS_PER_BATCH // length))
    samples = [sampler.sample(length) for _ in range(size)]
    width = max(len(ids) for ids, _ in samples)
    ids = torch.zeros(size, width, dtype=torch.long)
    weights = torch.zeros(size, width - 1)
    for row, (seq, w) in enumerate(samples):
        ids[row, :len(seq)] = torch.tensor(seq)
        weights[row, :len(w)] = torch.tensor(w)
    return ids, weights


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to a tenth over the progress."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def progress_at(step: int, steps: int, elapsed_s: float, minutes: float | None) -> float:
    """Training progress in [0, 1]: the step count, or the time budget if that runs out first
    (the CPUs here are shared, so a fixed step count could overrun the session)."""
    by_steps = step / steps
    return by_steps if not minutes else max(by_steps, elapsed_s / (60 * minutes))


@torch.no_grad()
def greedy(model: Qwen3ForCausalLM, ids: list[int], max_new: int, stop: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                         eos_token_id=stop, pad_token_id=0)
    return out[0, len(ids):].tolist()


def evaluate(model: Qwen3ForCausalLM, out_dir: Path, lengths: list[int]) -> dict[int, float]:
    model.eval()
    tok = load_tokenizer(out_dir)
    recall = {}
    for ctx in lengths:
        found = 0
        depths = (0.0, 0.5, 1.0)
        for depth in depths:
            prompt = needle_prompt(tok, ctx, depth, seed=1000 + ctx)
            generated = greedy(model, prompt.ids, ANSWER_TOKENS, tok.im_end_id)
            found += check_answer(tok, generated, prompt.answer)
        recall[ctx] = found / len(depths)
    model.train()
    return recall


def save_model(model: Qwen3ForCausalLM, out_dir: Path) -> None:
    model.save_pretrained(out_dir)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    # Readers that predate rope_parameters (and lmc) look for the top-level key.
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config["torch_dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "needle-tiny")
    parser.add_argument("--ckpt", type=Path, default=Path("/tmp/needle-train.pt"))
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--minutes", type=float,
                        help="time budget: progress follows the clock if it runs out first")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--qk-gain", type=float, default=QK_NORM_GAIN,
                        help="initial q_norm/k_norm gains")
    parser.add_argument("--needle-counts", default="1,1,2,4,8",
                        help="needles per conversation, drawn uniformly from this list")
    parser.add_argument("--lm-weight", type=float, default=LM_WEIGHT,
                        help="loss weight of the tokens that are not answers")
    parser.add_argument("--stage", type=int, help="on resume: restart the length curriculum "
                        "at this stage (0 = up to 320 tokens)")
    parser.add_argument("--longest", type=int, default=2304)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = write_tokenizer(args.out)
    tok = load_tokenizer(args.out)
    config = model_config(tokenizer.get_vocab_size(), max(8192, args.longest), args.layers,
                          args.heads, args.kv_heads, args.head_dim)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(args.qk_gain)
            layer.self_attn.k_norm.weight.fill_(args.qk_gain)
    model.config._attn_implementation = "sdpa"
    # No weight decay on norms (the q/k norm gains set how sharp attention can get) or embeddings.
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    others = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.01},
                                   {"params": others, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.98))
    counts = tuple(int(n) for n in args.needle_counts.split(","))
    sampler = ConversationSampler(tok, random.Random(args.seed), counts)
    sampler.lm_weight = args.lm_weight
    step, elapsed = 0, 0.0
    curriculum = Curriculum(args.longest)
    if args.ckpt.exists():
        state = torch.load(args.ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
        sampler.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        curriculum.stage = state.get("stage", 0) if args.stage is None else args.stage
        print(f"resumed at step {step} ({elapsed / 60:.1f} min)", flush=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {params}, vocab {config.vocab_size}", flush=True)
    model.train()
    started = time.time() - elapsed
    window: list[float] = []
    while (fraction := progress_at(step, args.steps, time.time() - started, args.minutes)) < 1:
        limit = curriculum.limit(fraction)
        ids, weights = make_batch(sampler, limit)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, fraction, args.lr, args.warmup)
        logits = model(input_ids=ids[:, :-1]).logits
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                 reduction="none").view_as(weights)
        loss = (losses * weights).sum() / weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        answer_mask = weights == 1.0
        window.append(losses[answer_mask].mean().item())
        step += 1
        if step % 25 == 0:
            answer_loss = sum(window) / len(window)
            print(f"step {step} len {ids.shape[1]} batch {ids.shape[0]} loss {loss.item():.3f} "
                  f"answer-loss {answer_loss:.3f} min {(time.time() - started) / 60:.1f}",
                  flush=True)
            window.clear()
            curriculum.observe(answer_loss)
        last = progress_at(step, args.steps, time.time() - started, args.minutes) >= 1
        if step % args.eval_every == 0 or last:
            save_model(model, args.out)
            lengths = [256, 1024, limit]
            print(f"step {step} recall {evaluate(model, args.out, sorted(set(lengths)))}",
                  flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step, "elapsed": time.time() - started,
                        "rng": sampler.rng.getstate(), "torch_rng": torch.get_rng_state(),
                        "stage": curriculum.stage},
                       args.ckpt)
    print(f"done: {step} steps in {(time.time() - started) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
