"""The eviction-prediction article's predictor: lmc's key-feature dump against transformers and the
definitions in engine/keyfeat.h, the C tree evaluation against scikit-learn bit for bit, the gbm and
h2o-prev policies, --kv-budget eviction, and the Python metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fixtures_engine import lmc_json, run_lmc, write_tokens
from sklearn.ensemble import HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits

from harness.errors import InputError
from harness.predictor.dump import read_dump, run_dump
from harness.predictor.metrics import query_scores
from harness.predictor.study import load_study
from harness.predictor.train import LayerModels, train, write_predictor

MODEL = "gqa4_untied_f32_old"  # 8 query heads over 2 KV heads, 2 layers, vocabulary 320
IDS = [(i * 37 + (i // 7) * 5) % 320 if i % 5 else 11 for i in range(96)]


def read_trace(path):
    """{(pos, layer, head): [blocks]} from a --trace-selection file."""
    out = {}
    for line in path.read_text().splitlines()[1:]:
        pos, layer, head, n, *blocks = map(int, line.split())
        assert n == len(blocks)
        out[(pos, layer, head)] = blocks
    return out


@pytest.fixture(scope="module")
def dump(lmc, tiny_model):
    return run_dump([str(lmc)], tiny_model(MODEL), IDS, every=1, text=0)


def test_dump_targets_are_transformers_attention(dump, tiny_model):
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(tiny_model(MODEL), dtype=torch.float32,
                                             attn_implementation="eager").eval()
    ppl_ids = IDS[:-1]  # ppl runs the positions that predict a next token
    with torch.no_grad():
        attn = model(torch.tensor([ppl_ids]), output_attentions=True).attentions
    mean = [a[0].mean(dim=0).numpy() for a in attn]  # [layer][query][key]
    q, layer, key = (dump.column(n).astype(int) for n in ("query", "layer", "key"))
    assert set(q) == set(range(len(ppl_ids))) and len(dump.rows) == 2 * sum(range(1, 96))
    want = np.array([mean[lay][t, j] for t, lay, j in zip(q, layer, key, strict=True)])
    np.testing.assert_allclose(dump.column("target"), want, atol=2e-5)
    # the cascade features are the same query's masses one and two layers down
    first = layer == 0
    np.testing.assert_array_equal(dump.column("prev_mass")[~first], dump.column("target")[first])
    assert not dump.column("prev_mass")[first].any() and not dump.column("prev2_mass").any()
    head3 = attn[0][0, 3].numpy()  # layer 0, query head 3
    np.testing.assert_allclose(dump.column("prev_head3")[~first],
                               head3[q[~first], key[~first]], atol=2e-5)


def test_dump_features_follow_their_definitions(dump, tiny_model):
    from safetensors.numpy import load_file

    emb = load_file(tiny_model(MODEL) / "model.safetensors")["model.embed_tokens.weight"]
    ids = IDS
    rows = dump.select(dump.column("layer") == 1)
    for r in rows.rows[::53]:
        t, j = int(r[0]), int(r[2])
        feat = dict(zip(rows.names, r, strict=True))
        assert feat["distance"] == t - j and feat["pos"] == j
        assert feat["rel_pos"] == np.float32(np.float32(j) / np.float32(t + 1))
        for w in (64, 128, 256):
            n = min(w, j)
            c = ids[j - n:j].count(ids[j])
            assert feat[f"s{w}"] == pytest.approx(math.log((n + 1) / (c + 1)), rel=1e-6)
        f = ids[:t + 1].count(ids[j])
        assert feat["freq"] == f
        assert feat["s_glob"] == pytest.approx(math.log((t + 1) / f), rel=1e-6)
        assert feat["same_token"] == (ids[j] == ids[t])
        dot = float(emb[ids[t]] @ emb[ids[j]])
        assert feat["emb_dot"] == pytest.approx(dot, rel=1e-5, abs=1e-6)
        assert feat["emb_norm"] == pytest.approx(float(np.linalg.norm(emb[ids[j]])), rel=1e-5)


def test_c_trees_equal_scikit_learn_bit_for_bit(lmc, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4000, 6)).astype(np.float32)
    x[:, 2] = np.round(x[:, 2] * 4)  # repeated values: thresholds between close neighbours
    y = 3 * x[:, 0] + np.sin(x[:, 1] * 3) + x[:, 2] * x[:, 3] + 0.1 * rng.standard_normal(4000)
    names = ["distance", "pos", "freq", "emb_dot", "s64", "prev_mass"]
    with threadpool_limits(1):  # OpenMP threads spin on a shared machine (train.OMP_THREADS)
        models = [HistGradientBoostingRegressor(max_iter=40, random_state=s).fit(x, y + s)
                  for s in range(2)]
    path = write_predictor(LayerModels("test", names, models), tmp_path / "t.gbm")
    # random inputs, plus every split threshold's float neighbours (where rounding would show)
    probe = [rng.standard_normal((3000, 6)).astype(np.float32) * 2]
    for tree in models[1]._predictors:
        for node in tree[0].nodes[tree[0].nodes["is_leaf"] == 0]:
            near = np.float32(node["num_threshold"])
            for v in (np.nextafter(near, -np.inf), near, np.nextafter(near, np.inf)):
                row = rng.standard_normal(6).astype(np.float32)
                row[node["feature_idx"]] = v
                probe.append(row[None])
    inputs = np.concatenate(probe)
    inputs[::97, 4] = np.nan  # missing values follow missing_go_to_left
    inputs.tofile(tmp_path / "x.bin")
    out = lmc_json(lmc, "predict", "--predictor", path, "--layer", 1,
                   "--inputs", tmp_path / "x.bin", "--dump-out", tmp_path / "y.bin")
    assert out["rows"] == len(inputs) and out["features"] == 6
    c_pred = np.fromfile(tmp_path / "y.bin", dtype="<f8")
    with threadpool_limits(1):
        want = models[1].predict(inputs.astype(np.float64))
    assert np.array_equal(c_pred, want)


@pytest.fixture(scope="module")
def predictor(dump, tmp_path_factory):
    path = tmp_path_factory.mktemp("gbm") / "cascade.gbm"
    return write_predictor(train(dump, "cascade", max_iter=15), path)


def test_gbm_policy_keeps_the_budget_and_is_thread_independent(lmc, tiny_model, predictor,
                                                               tmp_path):
    model = tiny_model(MODEL)
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    runs = []
    for threads in (1, 3):
        trace = tmp_path / f"trace{threads}.txt"
        out = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 5,
                       "--attn", "gbm", "--predictor", predictor, "--k", 3, "--block", 8,
                       "--threads", threads, "--trace-selection", trace, "--measure-selection")
        runs.append((out["tokens"], trace.read_text()))
    assert runs[0] == runs[1]
    sel = read_trace(tmp_path / "trace1.txt")
    # equal budget: k blocks, the newest among them; all heads of a layer share the key scores
    assert all(len(b) == 3 and b[-1] == pos // 8 for (pos, _, _), b in sel.items())
    assert all(sel[(p, lay, h)] == sel[(p, lay, 0)] for p, lay, h in sel)
    full = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 5,
                    "--attn", "gbm", "--predictor", predictor, "--k", 64, "--block", 8)
    exact = lmc_json(lmc, "generate", "--model", model, "--prompt", prompt, "--max-new", 5)
    assert full["tokens"] == exact["tokens"]


@pytest.mark.parametrize("policy", ["window", "h2o", "h2o-prev", "gbm", "random", "sparse",
                                    "quest", "oracle"])
def test_kv_budget_evicts_blocks_for_good(lmc, tiny_model, predictor, tmp_path, policy):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    trace = tmp_path / "trace.txt"
    extra = ["--predictor", predictor] if policy == "gbm" else []
    out = lmc_json(lmc, "generate", "--model", tiny_model(MODEL), "--prompt", prompt,
                   "--max-new", 12, "--attn", policy, "--kv-budget", 32, "--block", 8,
                   "--trace-selection", trace, "--measure-selection", *extra)
    assert out["config"]["kv_budget"] == 32
    sel = read_trace(trace)
    heads = {(lay, h) for _, lay, h in sel}
    for lay, h in heads:
        steps = sorted(p for p, la, he in sel if (la, he) == (lay, h))
        seen_gone: set[int] = set()
        for pos in steps:
            blocks = sel[(pos, lay, h)]
            assert len(blocks) <= 4 and blocks[-1] == pos // 8  # budget; the newest stays
            gone = set(range(pos // 8 + 1)) - set(blocks)
            assert seen_gone <= gone  # an evicted block never comes back
            seen_gone = gone
            if policy == "window":
                assert blocks == [0, *range(pos // 8 - len(blocks) + 2, pos // 8 + 1)]
    assert out["selection"]["mass"] < 1  # the evicted keys held some attention


@pytest.mark.parametrize("policy", ["sparse", "quest", "oracle"])
def test_block_policies_evict_by_their_block_scores_on_any_thread_count(lmc, tiny_model,
                                                                        tmp_path, policy):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    runs = []
    for threads in (1, 3):
        trace = tmp_path / f"{policy}{threads}.txt"
        out = lmc_json(lmc, "generate", "--model", tiny_model(MODEL), "--prompt", prompt,
                       "--max-new", 8, "--attn", policy, "--kv-budget", 32, "--block", 8,
                       "--prefill-attn", "sparse", "--threads", threads,
                       "--trace-selection", trace)
        runs.append((out["tokens"], trace.read_text()))
    assert runs[0] == runs[1]
    # the blocks kept are the query's, not an order of age: heads of one KV head disagree
    sel = read_trace(tmp_path / f"{policy}1.txt")
    assert any(sel[(p, lay, h)] != sel[(p, lay, 0)] for p, lay, h in sel)
    window = tmp_path / "window.txt"
    lmc_json(lmc, "generate", "--model", tiny_model(MODEL), "--prompt", prompt, "--max-new", 8,
             "--attn", "window", "--kv-budget", 32, "--block", 8, "--prefill-attn", "sparse",
             "--trace-selection", window)
    assert read_trace(window) != sel


def test_h2o_prev_ranks_by_the_previous_layers_mass(lmc, tiny_model, tmp_path):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    traces = []
    for threads in (1, 2):
        trace = tmp_path / f"t{threads}.txt"
        lmc_json(lmc, "generate", "--model", tiny_model(MODEL), "--prompt", prompt, "--max-new", 4,
                 "--attn", "h2o-prev", "--k", 3, "--block", 8, "--trace-selection", trace,
                 "--threads", threads)
        traces.append(trace.read_text())
    assert traces[0] == traces[1]
    sel = read_trace(tmp_path / "t1.txt")
    for pos in {p for p, _, _ in sel}:
        # layer 0 has no previous layer: all heads rank by the heads' summed accumulated mass
        first = sel[(pos, 0, 0)]
        assert all(sel[(pos, 0, h)] == first for h in range(8))
        # layer 1: this query's layer-0 attention is non-zero exactly on those blocks
        assert all(sel[(pos, 1, h)] == first for h in range(8))


@pytest.mark.parametrize("args, message", [
    (["--attn", "gbm"], "--attn gbm needs --predictor"),
    (["--attn", "h2o", "--predictor", "x.gbm"], "--predictor applies to --attn gbm only"),
    (["--attn", "exact", "--kv-budget", "64"], "--kv-budget evicts by the policy's scores"),
    (["--attn", "window", "--kv-budget", "4", "--block", "8"], "less than one block"),
])
def test_bad_predictor_and_budget_options_exit_2(lmc, tiny_model, tmp_path, args, message):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    proc = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt, *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_malformed_predictor_file_is_named(lmc, tiny_model, predictor, tmp_path):
    prompt = write_tokens(tmp_path / "p.txt", IDS)
    text = predictor.read_text().splitlines()
    bad = tmp_path / "bad.gbm"
    # a split whose child points back at itself would loop forever
    node = next(i for i, line in enumerate(text) if line.startswith("tree ")) + 1
    fields = text[node].split()
    fields[2] = "0"
    bad.write_text("\n".join([*text[:node], " ".join(fields), *text[node + 1:]]) + "\n")
    proc = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt, "--attn", "gbm",
                   "--predictor", bad)
    assert proc.returncode == 2 and f"--predictor {bad}: line {node + 1}" in proc.stderr
    unknown = tmp_path / "unknown.gbm"
    unknown.write_text(predictor.read_text().replace("prev_mass", "prev_head99", 1))
    proc = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", prompt, "--attn", "gbm",
                   "--predictor", unknown)
    assert proc.returncode == 2 and "prev_head99" in proc.stderr
    proc = run_lmc(lmc, "attn-bench", "--ctx", 64, "--heads", 2, "--kv-heads", 1, "--head-dim", 8,
                   "--attn", "gbm")
    assert proc.returncode == 2 and "not attn-bench" in proc.stderr


def test_rank_metrics_on_a_hand_checked_query():
    mass = np.arange(64, 0, -1) / 2080.0  # key j holds (64 - j) / 2080: keys 0..31 hold 1552
    rho, recall, captured, lost = query_scores(mass.copy(), mass)
    assert (rho, recall) == (pytest.approx(1), 1) and captured == pytest.approx(1552 / 2080)
    assert lost == pytest.approx(528 / 2080)  # keys 32..63 evicted: 32+31+...+1 = 528
    rho, recall, captured, lost = query_scores(-mass, mass)  # the heavy keys ranked last
    assert rho == pytest.approx(-1) and recall == 0 and captured == pytest.approx(528 / 2080)
    assert lost == pytest.approx(1552 / 2080)
    # ties keep the lower key first: a constant score keeps keys 0..31, carries no order
    rho, recall, captured, lost = query_scores(np.zeros(64), mass)
    assert (rho, recall, lost) == (0, 1, pytest.approx(528 / 2080))


def test_dump_reader_names_a_bad_file(tmp_path):
    bad = tmp_path / "x.bin"
    bad.write_bytes(b"lmc-keyfeat 1 5 1\nquery layer key distance target\n" + b"\0" * 7)
    with pytest.raises(InputError, match="not whole rows"):
        read_dump(bad)


def test_study_trains_ranks_and_runs_the_budgets(lmc, needle_model, tmp_path):
    import json
    import subprocess
    import sys

    study = tmp_path / "study.toml"
    study.write_text(f'name = "mini"\nmodel = "{needle_model}"\nctx = 160\ntrain_texts = 1\n'
                     'test_texts = 1\nppl_texts = 1\nevery = 2\nsets = ["v1", "cascade"]\n'
                     'predictor = "cascade"\nmax_iter = 5\nblock = 16\nbudgets = [0.25]\n'
                     'policies = ["gbm", "window"]\nmodes = ["select", "evict"]\n')
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "predictor", "study", str(study),
                           "--out", str(out), "--lmc", str(lmc)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "study.json").read_text())
    ranking = record["ranking"]
    assert set(ranking) == {"v1", "cascade", "h2o-prev", "recency", "random"}
    for scores in ranking.values():
        assert scores["overall"]["queries"] > 0 and len(scores["layers"]) == 2
        assert -1 <= scores["overall"]["rho"] <= 1 and 0 <= scores["overall"]["lost50"] <= 1
    assert len(record["ppl"]) == 2 * 1 * 2
    for row in record["ppl"]:
        assert row["delta_ppl_pct"] == pytest.approx(100 * (row["ppl"] / row["ppl_exact"] - 1))
    assert "| evict | 25% | gbm |" in (out / "index.md").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(study.read_text().replace("budgets = [0.25]", "budgets = [1.5]"))
    with pytest.raises(InputError, match=f"{bad}: key 'budgets'"):
        load_study(bad)


def test_study_text_windows_keep_training_apart_from_the_evaluated_windows(tmp_path):
    from harness import REPO_ROOT
    from harness.predictor.study import rank_texts, text_ids
    from harness.workloads import load_tokenizer, ppl_tokens

    lm = REPO_ROOT / "models" / "pydoc-lm"
    study_file = tmp_path / "study.toml"
    study_file.write_text(f'name = "t"\nmodel = "{lm}"\ntext = "{lm}/heldout.txt"\nctx = 1024\n'
                          'train_texts = 4\ntest_texts = 2\nppl_texts = 4\n')
    study = load_study(study_file)
    tokens = len(load_tokenizer(lm).encode((lm / "heldout.txt").read_text(encoding="utf-8")))
    windows = tokens // 1024
    train_texts, test_texts = rank_texts(study)
    assert list(train_texts) == list(range(windows - 4, windows))
    assert list(test_texts) == list(range(windows - 6, windows - 4))
    # the perplexity texts are a ppl spec's seeds 0-3: disjoint from both
    assert text_ids(study, 0, ppl=True) == ppl_tokens(lm, 1024, 0, text=lm / "heldout.txt").ids
    assert not set(range(4)) & (set(train_texts) | set(test_texts))
    too_long = study_file.read_text().replace("ctx = 1024", "ctx = 8192")
    study_file.write_text(too_long)
    with pytest.raises(InputError, match=rf"key 'text'.*{tokens // 8192} windows of 8192.*need 10"):
        rank_texts(load_study(study_file))
