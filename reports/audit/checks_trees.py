"""Claims about the learned predictor's trees themselves (the eviction-prediction article's
feature importance), computed from a tree file (``reports.audit.gbm_trees``): no runs.

- ``split_share``: ``feature``'s share of the splits of the trees in ``trees`` (a file relative
  to the claims file), pooled over layers and trees, less the share of ``rival`` (default: the
  largest share among the other features). The file has no split gains, so the importance here
  is the split count (LightGBM's default importance type; scikit-learn's
  HistGradientBoostingRegressor has none of its own). The counts are exact: the noise is 0, the
  unit one trained ensemble (its training was not repeated).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from reports.audit.claim import Claim
from reports.audit.evidence import Reading, Units
from reports.audit.gbm_trees import TreeFile, read_trees
from reports.audit.provenance import Provenance


def _percent(share: float) -> str:
    return f"{100 * share:.1f} %"


def _evidence(claim: Claim, trees: TreeFile) -> Provenance:
    digest = hashlib.sha256(trees.path.read_bytes()).hexdigest()[:8]
    return Provenance(model=f"the trees {trees.path.name} ({len(trees.splits)} layers, "
                            f"{trees.trees} trees)",
                      device="none (counted in the tree file)",
                      data=f"{sum(trees.counts().values())} splits of {trees.path.name}",
                      revision=f"trees={digest}",
                      article=claim.setting or "not stated in the claims file")


def split_share(claim: Claim, _runs: Any) -> Reading:
    params = claim.measure.params
    trees = read_trees(Path(str(params.get("trees", ""))))
    feature = str(params.get("feature", ""))
    shares = trees.shares()
    others = {name: share for name, share in shares.items() if name != feature}
    rival = str(params.get("rival", "") or max(others, key=lambda n: others[n], default=""))
    missing = [name for name in (feature, rival) if name not in shares]
    if missing:
        return Reading(reason=f"{trees.path.name} has no feature {', '.join(missing)} (its "
                              f"features: {', '.join(trees.names)})",
                       provenance=_evidence(claim, trees))
    counts = trees.counts()
    ranked = sorted(shares, key=lambda n: (-shares[n], n))
    layers = "; ".join(f"layer {i}: {feature} {_percent(trees.shares(i)[feature])}, {rival} "
                       f"{_percent(trees.shares(i)[rival])}" for i in range(len(trees.splits)))
    return Reading(
        value=shares[feature] - shares[rival],
        text=(f"{feature} {_percent(shares[feature])} of the splits ({counts[feature]} of "
              f"{sum(counts.values())}), {rival} {_percent(shares[rival])} ({counts[rival]})"),
        detail=(f"{feature} ranks {ranked.index(feature) + 1} of {len(ranked)}; split shares: "
                + ", ".join(f"{n} {_percent(shares[n])}" for n in ranked) + f"; {layers}"),
        noise=0.0, units=Units(1, f"one trained ensemble ({trees.path.name}): exact counts"),
        provenance=_evidence(claim, trees))
