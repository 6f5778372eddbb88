"""Train the eviction-prediction article's predictor per layer, evaluate it beside the
baselines, write the tree file.

Feature sets (names as in engine/keyfeat.h):

- ``v1``: geometry, windowed and global surprisal, frequency (no embeddings, no masses);
- ``v2``: v1 + the token-embedding dot product and norm;
- ``cascade``: v2 + the previous layer's attention mass (mean over heads);
- ``v3``: cascade + the mass two layers back and the previous layer's mass per head.

Each layer gets its own ``HistGradientBoostingRegressor`` fitted to ln(mass + 1e-6). Baselines
score keys without training: ``h2o-prev`` by the previous layer's mass, ``recency`` by
closeness, ``random`` by seeded noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor
from threadpoolctl import threadpool_limits

from harness.errors import InputError
from harness.predictor.dump import KeyDump
from harness.predictor.metrics import RankScores, group_bounds, rank_scores

V1 = ["distance", "rel_pos", "pos", "s64", "s128", "s256", "s_glob", "freq", "same_token"]
V2 = [*V1, "emb_dot", "emb_norm"]
CASCADE = [*V2, "prev_mass"]
FEATURE_SETS = ("v1", "v2", "cascade", "v3")
BASELINES = ("h2o-prev", "recency", "random")
MASS_FLOOR = 1e-6  # the target is ln(mass + MASS_FLOOR); lmc ranks by exp(prediction)
# scikit-learn's OpenMP threads spin; on a shared 2-core machine one thread fitted the same trees
# 19x faster (7 s against 140 s for 50 rounds on 60k rows), and the trees do not depend on it
OMP_THREADS = 1


def feature_names(feature_set: str, available: Sequence[str]) -> list[str]:
    if feature_set == "v1":
        return list(V1)
    if feature_set == "v2":
        return list(V2)
    if feature_set == "cascade":
        return list(CASCADE)
    if feature_set == "v3":
        heads = [n for n in available if n.startswith("prev_head")]
        return [*CASCADE, "prev2_mass", *heads]
    raise InputError(f"unknown feature set {feature_set!r} (allowed: {', '.join(FEATURE_SETS)})")


@dataclass
class LayerModels:
    """One feature set's trees, one regressor per layer."""

    feature_set: str
    names: list[str]
    models: list[HistGradientBoostingRegressor]

    def predict(self, dump: KeyDump) -> np.ndarray:
        """Raw predictions (ln mass) for every row of ``dump``, each by its layer's model."""
        x = _matrix(dump, self.names)
        layer = dump.column("layer").astype(int)
        out = np.empty(len(x))
        with threadpool_limits(OMP_THREADS):
            for index, model in enumerate(self.models):
                mask = layer == index
                if mask.any():
                    out[mask] = model.predict(x[mask])
        return out


@dataclass
class Evaluation:
    """Metrics per scorer (feature sets and baselines): per layer and over all layers."""

    per_layer: dict[str, list[RankScores]] = field(default_factory=dict)
    overall: dict[str, RankScores] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {name: {"overall": self.overall[name].to_dict(),
                       "layers": [s.to_dict() for s in self.per_layer[name]]}
                for name in self.overall}


def _matrix(dump: KeyDump, names: Sequence[str]) -> np.ndarray:
    missing = [n for n in names if n not in dump.names]
    if missing:
        raise InputError(f"the key-feature dump lacks {', '.join(missing)}")
    return np.stack([dump.column(n) for n in names], axis=1)


def n_layers(dump: KeyDump) -> int:
    return int(dump.column("layer").max()) + 1


def train(dump: KeyDump, feature_set: str, max_iter: int = 100, seed: int = 0) -> LayerModels:
    """Fit one regressor per layer on ``dump`` with ``feature_set``'s columns."""
    names = feature_names(feature_set, dump.names)
    x, y = _matrix(dump, names), np.log(dump.column("target").astype(np.float64) + MASS_FLOOR)
    layer = dump.column("layer").astype(int)
    models = []
    for index in range(n_layers(dump)):
        mask = layer == index
        model = HistGradientBoostingRegressor(max_iter=max_iter, max_leaf_nodes=31,
                                              learning_rate=0.1, early_stopping=False,
                                              random_state=seed)
        with threadpool_limits(OMP_THREADS):
            models.append(model.fit(x[mask], y[mask]))
    return LayerModels(feature_set, names, models)


def baseline_scores(dump: KeyDump, name: str, seed: int = 0) -> np.ndarray:
    if name == "h2o-prev":
        return dump.column("prev_mass").astype(np.float64)
    if name == "recency":
        return -dump.column("distance").astype(np.float64)
    if name == "random":
        return np.random.default_rng(seed).random(len(dump.rows))
    raise InputError(f"unknown baseline {name!r} (allowed: {', '.join(BASELINES)})")


def evaluate(dump: KeyDump, scorers: dict[str, np.ndarray]) -> Evaluation:
    """The article's metrics of each scorer's key scores on ``dump``, per layer and overall."""
    keys = np.stack([dump.text, dump.column("query"), dump.column("layer")], axis=1)
    groups = group_bounds(keys)
    layer_of = [int(keys[a, 2]) for a, _ in groups]
    mass = dump.column("target").astype(np.float64)
    result = Evaluation()
    for name, score in scorers.items():
        result.overall[name] = rank_scores(score, mass, groups)
        result.per_layer[name] = [
            rank_scores(score, mass,
                        [g for g, at in zip(groups, layer_of, strict=True) if at == index])
            for index in range(n_layers(dump))]
    return result


def _float32_at_most(value: float) -> np.float32:
    """The largest float32 not above ``value``: for any float32 x, x <= result exactly when
    double(x) <= value, which makes lmc's float comparisons decide as scikit-learn's."""
    f = np.float32(value)
    if float(f) > value:
        f = np.nextafter(f, np.float32(-np.inf))
    return f


def export_text(models: LayerModels) -> str:
    """The ``lmc-gbm 1`` file (engine/predictor.h): every float in C99 hex, nothing rounded."""
    lines = ["lmc-gbm 1", f"features {len(models.names)} {' '.join(models.names)}",
             f"layers {len(models.models)}"]
    for index, model in enumerate(models.models):
        predictors = [it[0] for it in model._predictors]  # one tree per iteration (regression)
        baseline = float(np.asarray(model._baseline_prediction).ravel()[0])
        lines.append(f"layer {index} baseline {baseline.hex()} trees {len(predictors)}")
        for tree in predictors:
            nodes = tree.nodes
            lines.append(f"tree {len(nodes)}")
            for n in nodes:
                if n["is_categorical"]:
                    raise InputError("categorical splits cannot be exported to lmc")
                thr = float(_float32_at_most(float(n["num_threshold"])))
                lines.append(f"{int(n['feature_idx'])} {thr.hex()} {int(n['left'])} "
                             f"{int(n['right'])} {int(n['is_leaf'])} {float(n['value']).hex()} "
                             f"{int(n['missing_go_to_left'])}")
    return "\n".join(lines) + "\n"


def write_predictor(models: LayerModels, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(export_text(models))
    return path
