"""lmc ppl --measure-keys N: the eviction-prediction article's ranking metrics (rho, top-32 recall,
mass captured, mass lost at 50 %) of a policy's keep scores, computed in C, against the Python
definitions (harness/predictor/metrics.py with scipy) on the same run's key-feature dump; and the
two-stage candidate figures (top-32 recall of the top-C of the last 128 keys, the mass the
pipeline's top 32 keeps at C = 96) against a plain numpy computation from the same dump."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_engine import lmc_json, run_lmc, write_tokens

from harness.predictor.dump import KeyDump, read_dump
from harness.predictor.metrics import group_bounds, rank_scores
from harness.predictor.train import train, write_predictor

MODEL = "gqa4_untied_f32_old"  # 8 query heads over 2 KV heads, 2 layers, vocabulary 320
IDS = [(i * 37 + (i // 7) * 5) % 320 if i % 5 else 11 for i in range(160)]
EVERY = 4
FIELDS = ("rho", "recall32", "captured32", "lost50")
UNIVERSE, CANDIDATES = 128, (32, 48, 64, 96)


def measured(lmc, model, tmp_path, policy: str, *extra: str) -> tuple[dict, KeyDump]:
    ids = write_tokens(tmp_path / "ids.txt", IDS)
    dump = tmp_path / f"{policy}.bin"
    doc = lmc_json(lmc, "ppl", "--model", model, "--text", ids, "--attn", policy,
                   "--measure-keys", EVERY, "--dump-features", dump, "--dump-every", EVERY,
                   *extra)
    return doc, read_dump(dump)


def python_layer(dump: KeyDump, score: np.ndarray, layer: int) -> dict:
    mask = dump.column("layer") == layer
    part = dump.select(mask)
    keys = np.stack([part.column("query"), part.column("layer")], axis=1)
    scores = rank_scores(score[mask], part.column("target").astype(np.float64),
                         group_bounds(keys))
    return scores.to_dict()


def numpy_candidates(dump: KeyDump, score: np.ndarray, layer: int) -> dict:
    """Per query with 128 keys or more, at ``layer``: of its last 128 keys, the true top 32 by
    mass, the scorer's top C, and the 32 largest masses among the scorer's top 96; means."""
    rows = []
    at_layer = dump.column("layer") == layer
    for query in np.unique(dump.column("query")[at_layer]):
        mine = at_layer & (dump.column("query") == query)
        keys = dump.column("key")[mine]
        last = np.argsort(keys)[-UNIVERSE:]
        if len(keys) < UNIVERSE:
            continue
        mass = dump.column("target")[mine].astype(np.float64)[last]
        by_score = np.argsort(-score[mine][last], kind="stable")
        true_top = set(np.argsort(-mass, kind="stable")[:32].tolist())
        recalls = [len(true_top & set(by_score[:c].tolist())) / 32 for c in CANDIDATES]
        kept = np.sort(mass[by_score[:96]])[::-1][:32].sum() / mass.sum()
        rows.append([*recalls, kept])
    means = np.mean(rows, axis=0) if rows else [None] * 5
    names = [f"recall32_c{c}" for c in CANDIDATES] + ["kept32_c96"]
    return {"cand_queries": len(rows)} | dict(zip(names, means, strict=True))


def assert_same(c_layer: dict, py: dict, candidates: dict) -> None:
    assert c_layer["queries"] == py["queries"] > 0
    for name in FIELDS:
        assert c_layer[name] == pytest.approx(py[name], abs=1e-6), name
    # of the measured positions, 127, 131, ..., 155 have a whole 128-key universe
    assert c_layer["cand_queries"] == candidates["cand_queries"] == len(range(127, 159, 4))
    for name, value in candidates.items():
        assert c_layer[name] == pytest.approx(value, abs=1e-6), name


def test_window_and_h2o_prev_rankings_match_the_python_metrics(lmc, tiny_model, tmp_path):
    model = tiny_model(MODEL)
    exact = lmc_json(lmc, "ppl", "--model", model, "--text",
                     write_tokens(tmp_path / "ids.txt", IDS))
    docs = {}
    for policy in ("window", "h2o-prev"):
        doc, dump = measured(lmc, model, tmp_path, policy)
        docs[policy] = doc
        # prefill stays exact: the measurement does not change the run
        assert doc["nll"] == exact["nll"]
        ranking = doc["key_ranking"]
        # queries at positions t >= 63 with (t + 1) % 4 == 0, at both layers
        assert ranking["every"] == EVERY and ranking["queries"] == 2 * len(range(63, 159, 4))
        if policy == "window":  # the keep score is the position: recency
            score = dump.column("key").astype(np.float64)
            for layer in (0, 1):
                assert_same(ranking["layers"][layer], python_layer(dump, score, layer),
                            numpy_candidates(dump, score, layer))
        else:  # the previous layer's mass (layer 0 ranks by accumulated mass, not dumped)
            score = dump.column("prev_mass").astype(np.float64)
            assert_same(ranking["layers"][1], python_layer(dump, score, 1),
                        numpy_candidates(dump, score, 1))
            # a scorer that is not recency misses some of the true top 32 at C = 32
            assert ranking["layers"][1]["recall32_c32"] < ranking["layers"][1]["recall32_c96"]
    # the two scorers rank differently: the figures are the policy's, not a fixed order
    assert docs["window"]["key_ranking"]["rho"] != docs["h2o-prev"]["key_ranking"]["rho"]


def test_gbm_ranking_matches_the_python_trees(lmc, tiny_model, tmp_path):
    model = tiny_model(MODEL)
    _, dump = measured(lmc, model, tmp_path, "window")
    trees = train(dump, "cascade", max_iter=5)
    predictor = write_predictor(trees, tmp_path / "cascade.gbm")
    doc, _ = measured(lmc, model, tmp_path, "gbm", "--predictor", predictor)
    predicted = trees.predict(dump)  # ln mass; lmc ranks by exp(prediction) in float32
    score = np.exp(predicted).astype(np.float32).astype(np.float64)
    for layer in (0, 1):
        assert_same(doc["key_ranking"]["layers"][layer], python_layer(dump, score, layer),
                    numpy_candidates(dump, score, layer))


def test_measure_keys_needs_a_policy_with_a_keep_score(lmc, tiny_model, tmp_path):
    ids = write_tokens(tmp_path / "ids.txt", IDS)
    done = run_lmc(lmc, "ppl", "--model", tiny_model(MODEL), "--text", ids, "--attn", "exact",
                   "--measure-keys", "4")
    assert done.returncode == 2 and "--measure-keys" in done.stderr and "exact" in done.stderr


def test_key_ranking_is_the_same_for_any_thread_count(lmc, tiny_model, tmp_path):
    model = tiny_model(MODEL)
    for policy in ("h2o", "sparse"):
        docs = [measured(lmc, model, tmp_path, policy, "--threads", str(t))[0]["key_ranking"]
                for t in (1, 3)]
        assert docs[0] == docs[1] and docs[0]["queries"] > 0


def numpy_lost(dump: KeyDump, score: np.ndarray, layer: int, keep: int) -> float:
    """Per query with 64 keys or more, at ``layer``: the true mass of the n * (100 - keep) / 100
    (rounded down) keys of lowest score, over the total; the mean."""
    lost = []
    at_layer = dump.column("layer") == layer
    for query in np.unique(dump.column("query")[at_layer]):
        mine = at_layer & (dump.column("query") == query)
        mass = dump.column("target")[mine].astype(np.float64)
        if len(mass) < 64:
            continue
        by_score = np.argsort(-score[mine], kind="stable")
        evicted = len(mass) * (100 - keep) // 100
        lost.append(mass[by_score[len(mass) - evicted:]].sum() / mass.sum())
    return float(np.mean(lost))


def test_mass_lost_at_a_kept_share_other_than_half(lmc, tiny_model, tmp_path):
    """--measure-keys-keep P: lost_keep is the mass lost keeping P % of the keys (seed 004's
    25 % budget column); by default P = 50 and it is lost50."""
    model = tiny_model(MODEL)
    half, dump = measured(lmc, model, tmp_path, "window")
    quarter, _ = measured(lmc, model, tmp_path, "window", "--measure-keys-keep", "25")
    score = dump.column("key").astype(np.float64)
    assert half["key_ranking"]["keep"] == 50 and quarter["key_ranking"]["keep"] == 25
    for layer in (0, 1):
        at_half, at_quarter = half["key_ranking"]["layers"][layer], \
            quarter["key_ranking"]["layers"][layer]
        assert at_half["lost_keep"] == at_half["lost50"]
        assert at_quarter["lost_keep"] == pytest.approx(numpy_lost(dump, score, layer, 25),
                                                        abs=1e-6)
        # keeping a quarter loses more than keeping half; the other figures do not move
        assert at_quarter["lost_keep"] > at_quarter["lost50"] == at_half["lost50"]


def numpy_direct(dump: KeyDump, score: np.ndarray, layer: int, direct: int) -> tuple[int, float]:
    """Per query with 2 * ``direct`` keys or more, at ``layer``: the share of the true top 32 by
    mass among the scorer's top ``direct`` of all its keys; the count and the mean."""
    recalls = []
    at_layer = dump.column("layer") == layer
    for query in np.unique(dump.column("query")[at_layer]):
        mine = at_layer & (dump.column("query") == query)
        mass = dump.column("target")[mine].astype(np.float64)
        if len(mass) < 2 * direct:
            continue
        true_top = set(np.argsort(-mass, kind="stable")[:32].tolist())
        chosen = set(np.argsort(-score[mine], kind="stable")[:direct].tolist())
        recalls.append(len(true_top & chosen) / 32)
    return len(recalls), float(np.mean(recalls))


def test_direct_recall_over_the_whole_context(lmc, tiny_model, tmp_path):
    """--measure-keys-direct D: the top-32 recall of the scorer's top D of all keys (seed 004's
    direct-256 at L = 1024), over queries with 2 D keys or more; off (null) by default."""
    model = tiny_model(MODEL)
    off, dump = measured(lmc, model, tmp_path, "h2o-prev")
    on, _ = measured(lmc, model, tmp_path, "h2o-prev", "--measure-keys-direct", "48")
    assert off["key_ranking"]["direct"] == 0 and off["key_ranking"]["recall32_direct"] is None
    assert on["key_ranking"]["direct"] == 48
    score = dump.column("prev_mass").astype(np.float64)
    layer = on["key_ranking"]["layers"][1]  # layer 0's accumulated mass is not dumped
    count, recall = numpy_direct(dump, score, 1, 48)
    assert layer["direct_queries"] == count == len(range(95, 159, 4))
    assert layer["recall32_direct"] == pytest.approx(recall, abs=1e-6)
    # the other figures do not move
    assert {k: v for k, v in layer.items() if "direct" not in k} == \
        {k: v for k, v in off["key_ranking"]["layers"][1].items() if "direct" not in k}
