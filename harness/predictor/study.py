"""A predictor study (``specs/studies/*.toml``): train the eviction-prediction article's predictor
on a model, then set it against the baselines at equal KV budgets, offline (rank metrics on held-out
texts) and in ``lmc`` (perplexity change against exact attention), and write the report.

The study file (every key optional but ``name`` and ``model``; errors name the file and key):

    name = "predictor-study"
    model = "../../models/needle-tiny"   # relative to the study file
    ctx = 512                            # tokens per text
    train_texts = 4                      # needle prompts that train the trees
    test_texts = 2                       # held-out needle prompts for the rank metrics
    ppl_texts = 2                        # plain-prose texts for the perplexity runs
    text = "../../models/pydoc-lm/heldout.txt"  # optional: every text is a window of this file
    every = 4                            # dump every N-th query position
    sets = ["v1", "v2", "cascade", "v3"] # feature sets to train and rank
    predictor = "cascade"                # the set lmc runs as --attn gbm
    max_iter = 50                        # boosting rounds per layer
    block = 16                           # positions per block
    budgets = [0.25, 0.5]                # fractions of the context kept
    policies = ["gbm", "h2o", "h2o-prev", "window", "random"]
    modes = ["select", "evict"]          # per-query --k selection / --kv-budget eviction

Without ``text`` the trees train and rank on needle prompts and the perplexity runs over the
grammar prose (the needle model's own text). With ``text`` (a UTF-8 file relative to the study
file, e.g. a language model's held-out text) every text is a window of ``ctx`` tokens of that
file (window s = the ppl workload's seed s), and the three parts take disjoint windows:
perplexity the first ``ppl_texts`` (the windows a ppl spec with seeds 0, 1, ... runs, so the
trained trees can run there too without having seen them), training the last ``train_texts``,
ranking the ``test_texts`` before those.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engines.lmc import run_here
from harness.errors import InputError
from harness.predictor.dump import KeyDump, concat, run_dump
from harness.predictor.train import (
    BASELINES,
    FEATURE_SETS,
    Evaluation,
    baseline_scores,
    evaluate,
    train,
    write_predictor,
)
from harness.workloads import load_tokenizer, needle_prompt, ppl_tokens

POLICIES = ("gbm", "h2o", "h2o-prev", "window", "random")
MODES = ("select", "evict")


@dataclass
class Study:
    path: Path
    name: str
    model: Path
    ctx: int = 512
    train_texts: int = 4
    test_texts: int = 2
    ppl_texts: int = 2
    every: int = 4
    sets: list[str] = field(default_factory=lambda: list(FEATURE_SETS))
    predictor: str = "cascade"
    max_iter: int = 50
    block: int = 16
    budgets: list[float] = field(default_factory=lambda: [0.25, 0.5])
    policies: list[str] = field(default_factory=lambda: list(POLICIES))
    modes: list[str] = field(default_factory=lambda: list(MODES))
    text: Path | None = None  # windows of this file instead of needle prompts and grammar prose


def load_study(path: Path) -> Study:
    """Read and check a study file; InputError names the file and the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read study {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from exc
    defaults = Study(path, "", Path())
    allowed = set(defaults.__dataclass_fields__) - {"path"}

    def fail(key: str, message: str) -> InputError:
        return InputError(f"{path}: key '{key}': {message}")

    for key in data:
        if key not in allowed:
            raise fail(key, f"unknown key; allowed: {', '.join(sorted(allowed))}")
    for key in ("name", "model"):
        if not isinstance(data.get(key), str):
            raise fail(key, "required, a string")
    model = (Path(path).parent / data["model"]).resolve()
    if not (model / "config.json").is_file():
        raise fail("model", f"{model} is not a model directory with a config.json")
    study = Study(Path(path), data["name"], model)
    for key in ("ctx", "train_texts", "test_texts", "ppl_texts", "every", "max_iter", "block"):
        value = data.get(key, getattr(defaults, key))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(key, f"must be a positive integer, got {value!r}")
        setattr(study, key, value)
    for key, choices in (("sets", FEATURE_SETS), ("policies", POLICIES), ("modes", MODES)):
        value = data.get(key, getattr(defaults, key))
        if not isinstance(value, list) or not value or any(v not in choices for v in value):
            raise fail(key, f"must be a non-empty list of {', '.join(choices)}; got {value!r}")
        setattr(study, key, value)
    budgets = data.get("budgets", defaults.budgets)
    if not isinstance(budgets, list) or not budgets or any(
            isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < 1
            for b in budgets):
        raise fail("budgets", f"must be a non-empty list of fractions in (0, 1); got {budgets!r}")
    study.budgets = [float(b) for b in budgets]
    if "text" in data:
        if not isinstance(data["text"], str):
            raise fail("text", "must be a string: a text file relative to the study file")
        study.text = (Path(path).parent / data["text"]).resolve()
        if not study.text.is_file():
            raise fail("text", f"{study.text} is not a file")
    study.predictor = data.get("predictor", defaults.predictor)
    if study.predictor not in study.sets:
        raise fail("predictor", f"must be one of the trained sets {study.sets}")
    return study


def text_ids(study: Study, index: int, ppl: bool = False) -> list[int]:
    """The ids of the study's text ``index``: window ``index`` of the study's text file, or
    else a needle prompt (ranking) or grammar prose (``ppl``) seeded by it."""
    if study.text is not None:
        return ppl_tokens(study.model, study.ctx, index, text=study.text).ids
    if ppl:
        return ppl_tokens(study.model, study.ctx, index).ids
    return needle_prompt(study.model, study.ctx, (index % 5) / 4, index).ids


def rank_texts(study: Study) -> tuple[range, range]:
    """The texts that train the trees and the held-out ones that rank keys."""
    if study.text is None:
        return range(study.train_texts), range(study.train_texts,
                                               study.train_texts + study.test_texts)
    windows = len(load_tokenizer(study.model).encode(study.text.read_text(encoding="utf-8"))) \
        // study.ctx
    need = study.ppl_texts + study.test_texts + study.train_texts
    if need > windows:
        raise InputError(f"{study.path}: key 'text': {study.text} holds {windows} windows of "
                         f"{study.ctx} tokens; ppl_texts + test_texts + train_texts need {need}")
    first_train = windows - study.train_texts
    return range(first_train, windows), range(first_train - study.test_texts, first_train)


def dump_texts(study: Study, lmc: list[str], texts: range) -> KeyDump:
    """Exact-attention dumps of the texts."""
    return concat([run_dump(lmc, study.model, text_ids(study, i), study.every, text=i)
                   for i in texts])


def rank_study(study: Study, lmc: list[str], out: Path) -> tuple[Evaluation, dict[str, Path]]:
    """Train every feature set, rank the held-out keys with them and the baselines."""
    train_texts, test_texts = rank_texts(study)
    train_dump = dump_texts(study, lmc, train_texts)
    test_dump = dump_texts(study, lmc, test_texts)
    scorers, files = {}, {}
    for feature_set in study.sets:
        models = train(train_dump, feature_set, max_iter=study.max_iter)
        scorers[feature_set] = models.predict(test_dump)
        files[feature_set] = write_predictor(models, out / f"predictor-{feature_set}.gbm")
    for name in BASELINES:
        scorers[name] = baseline_scores(test_dump, name)
    return evaluate(test_dump, scorers), files


def _nll(lmc: list[str], model: Path, ids: Sequence[int], args: Sequence[str]) -> float:
    return float(run_here(lmc, "ppl", model, ids, args, timeout=1800)["nll"])


def budget_args(study: Study, policy: str, mode: str, budget: float, predictor: Path) -> list[str]:
    """lmc arguments for one policy at one budget: k blocks, or kv-budget positions."""
    blocks = math.ceil(study.ctx / study.block)
    args = ["--attn", policy, "--block", str(study.block), "--prefill-attn", "sparse"]
    if mode == "select":
        args += ["--k", str(max(1, round(budget * blocks)))]
    else:
        args += ["--kv-budget", str(max(1, round(budget * blocks)) * study.block)]
    if policy == "gbm":
        args += ["--predictor", str(predictor)]
    return args


def ppl_study(study: Study, lmc: list[str], predictor: Path) -> list[dict[str, Any]]:
    """Perplexity of every policy x mode x budget against exact attention, over the texts."""
    rows = []
    texts = [text_ids(study, seed, ppl=True) for seed in range(study.ppl_texts)]
    exact = sum(_nll(lmc, study.model, ids, []) for ids in texts) / len(texts)
    for mode in study.modes:
        for budget in study.budgets:
            for policy in study.policies:
                args = budget_args(study, policy, mode, budget, predictor)
                nll = sum(_nll(lmc, study.model, ids, args) for ids in texts) / len(texts)
                rows.append({"policy": policy, "mode": mode, "budget": budget,
                             "ppl": math.exp(nll), "ppl_exact": math.exp(exact),
                             "delta_ppl_pct": 100 * (math.exp(nll - exact) - 1)})
    return rows


def render_markdown(study: Study, ranks: Evaluation, ppl_rows: list[dict[str, Any]]) -> str:
    if study.text is not None:
        train, test = rank_texts(study)
        texts = (f"windows of {study.ctx} tokens of `{study.text.name}`: trees trained on "
                 f"windows {train.start}-{train.stop - 1}, keys ranked on {test.start}-"
                 f"{test.stop - 1}, perplexity over 0-{study.ppl_texts - 1}")
    else:
        texts = (f"trees trained on {study.train_texts} needle prompts, ranked on "
                 f"{study.test_texts} held-out ones, perplexity over {study.ppl_texts} prose texts")
    lines = [f"# Predictor study: {study.name}", "",
             f"Model `{study.model.name}`, context {study.ctx}, blocks of {study.block}; "
             f"{texts}.",
             "", "## Key ranking (held-out texts; all layers, then per layer)", "",
             "| scorer | layer | Spearman rho | top-32 recall | mass in top 32 "
             "| mass lost at 50 % |", "|---|---|---|---|---|---|"]
    for name, overall in ranks.overall.items():
        for label, s in [("all", overall), *((str(i), s) for i, s in
                                              enumerate(ranks.per_layer[name]))]:
            lines.append(f"| {name} | {label} | {s.rho:.3f} | {s.recall32:.3f} | "
                         f"{s.captured32:.3f} | {s.lost50:.3f} |")
    lines += ["", f"## Perplexity change against exact attention (gbm = `{study.predictor}`)", "",
              "| mode | budget | policy | ppl | exact ppl | delta ppl % |",
              "|---|---|---|---|---|---|"]
    for r in ppl_rows:
        lines.append(f"| {r['mode']} | {r['budget']:.0%} | {r['policy']} | {r['ppl']:.6g} | "
                     f"{r['ppl_exact']:.6g} | {r['delta_ppl_pct']:+.2f} |")
    return "\n".join(lines) + "\n"


def run_study(study: Study, lmc: list[str], out: Path) -> dict[str, Any]:
    """Everything: the .gbm files, study.json and index.md under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    ranks, files = rank_study(study, lmc, out)
    ppl_rows = ppl_study(study, lmc, files[study.predictor])
    record = {"name": study.name, "model": str(study.model), "ctx": study.ctx,
              "text": None if study.text is None else str(study.text),
              "block": study.block, "predictor": study.predictor,
              "predictors": {k: str(v) for k, v in files.items()},
              "ranking": ranks.to_dict(), "ppl": ppl_rows}
    (out / "study.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "index.md").write_text(render_markdown(study, ranks, ppl_rows))
    return record
