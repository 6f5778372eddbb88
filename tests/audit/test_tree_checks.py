"""The audit's check of the learned predictor's trees (metric ``split_share``): each feature's
share of the splits, counted in a tree file; on a file written here from known splits, and on
the shipped trees the eviction-prediction article's importance claims are judged on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from reports.audit import load_claims, parse_claims
from reports.audit.gbm_trees import read_trees
from reports.audit.verdict import computed
from reports.errors import ReportInputError

REPO = Path(__file__).resolve().parents[2]


def leaf(value: str = "0x1p-1") -> str:
    return f"0 0x0.0p+0 0 0 1 {value} 0"


def split(feature: int, left: int, right: int) -> str:
    return f"{feature} 0x1p+0 {left} {right} 0 0x0.0p+0 1"


# features a, b, c. Layer 0: one tree splitting on a; one on a, then b. Layer 1: one tree on
# c, then a and c. Splits: a 3 (2 + 1), b 1, c 2, of 6: shares 1/2, 1/6, 1/3; layer 1 alone:
# a 1/3, b 0, c 2/3. Leaves carry feature 0 (a), as the exporter writes them: not splits.
TREES = "\n".join([
    "lmc-gbm 1", "features 3 a b c", "layers 2",
    "layer 0 baseline 0x1p+0 trees 2",
    "tree 3", split(0, 1, 2), leaf(), leaf(),
    "tree 5", split(0, 1, 2), leaf(), split(1, 3, 4), leaf(), leaf(),
    "layer 1 baseline -0x1p+0 trees 1",
    "tree 7", split(2, 1, 4), split(0, 2, 3), leaf(), leaf(), split(2, 5, 6), leaf(), leaf(),
]) + "\n"


def claim_text(**params: str) -> str:
    pairs = ", ".join(f'{k} = "{v}"' for k, v in params.items())
    return f"""
[[claim]]
id = "share"
source = "test"
statement = "a feature leads the splits"
quote = "q"
metric = "split_share"
at_least = 0.0
measure = {{ params = {{ {pairs} }} }}
"""


@pytest.fixture
def trees(tmp_path: Path) -> Path:
    (tmp_path / "t.gbm").write_text(TREES)
    return tmp_path / "t.gbm"


def judge(tmp_path: Path, **params: str):
    claims = parse_claims(claim_text(**params), tmp_path / "claims.toml")
    return computed(claims.claims[0], None)


def test_split_shares_of_known_splits(trees: Path) -> None:
    read = read_trees(trees)
    assert read.names == ("a", "b", "c") and read.trees == 3
    assert read.counts() == {"a": 3, "b": 1, "c": 2}
    assert read.shares() == pytest.approx({"a": 1 / 2, "b": 1 / 6, "c": 1 / 3})
    assert read.shares(1) == pytest.approx({"a": 1 / 3, "b": 0.0, "c": 2 / 3})


def test_split_share_judges_a_lead_over_the_largest_other_or_a_named_rival(
        trees: Path, tmp_path: Path) -> None:
    leads = judge(tmp_path, trees="t.gbm", feature="a")  # over c: 1/2 - 1/3
    assert leads.grade == "direction holds" and leads.measured == pytest.approx(1 / 6)
    assert "a 50.0 % of the splits (3 of 6), c 33.3 %" in leads.measured_text
    assert leads.noise == 0.0 and leads.units.count == 1
    behind = judge(tmp_path, trees="t.gbm", feature="c")  # under a: 1/3 - 1/2
    assert behind.grade == "direction fails" and behind.measured == pytest.approx(-1 / 6)
    assert "layer 1: c 66.7 %, a 33.3 %" in behind.reason
    rival = judge(tmp_path, trees="t.gbm", feature="c", rival="b")  # 1/3 - 1/6
    assert rival.grade == "direction holds" and rival.measured == pytest.approx(1 / 6)
    unknown = judge(tmp_path, trees="t.gbm", feature="d")
    assert unknown.grade == "not comparable" and "no feature d" in unknown.reason


def test_tree_file_errors_name_the_file_line_and_key(trees: Path, tmp_path: Path) -> None:
    with pytest.raises(ReportInputError, match="measure.params.trees.*no such file"):
        judge(tmp_path, trees="missing.gbm", feature="a")
    trees.write_text(TREES.replace(split(1, 3, 4), split(3, 3, 4)))
    with pytest.raises(ReportInputError, match=r"t\.gbm:12: feature 3 of a split"):
        read_trees(trees)
    trees.write_text(TREES.replace("tree 7", "tree 8"))
    with pytest.raises(ReportInputError, match="ends where a node was expected"):
        read_trees(trees)


def counted(path: Path) -> Counter[int]:
    """Splits per feature index, read off the node lines (7 fields, is_leaf 0) directly."""
    return Counter(int(f[0]) for f in (line.split() for line in path.read_text().splitlines())
                   if len(f) == 7 and f[4] == "0")


def test_seed_004_importance_claims_are_judged_on_the_shipped_trees() -> None:
    claims = {c.id: c for c in load_claims(REPO / "claims"
                                           / "seed_004_attention_prediction.toml").claims}
    # the article's own figures (MiniCPM5-2B) stay reported, beside the directions tested here
    assert claims["004-gbm-position-importance"].metric == "reported"
    assert claims["004-emb-dot-importance"].metric == "reported"
    judged = {"004-rel-pos-leads-splits-v1": ("rel_pos", "pydoc-lm-v1.gbm"),
              "004-rel-pos-leads-splits-v2": ("rel_pos", "pydoc-lm-v2.gbm"),
              "004-emb-dot-below-emb-norm-splits-v2": ("emb_norm", "pydoc-lm-v2.gbm")}
    for name, (feature, file) in judged.items():
        verdict = computed(claims[name], None)
        assert verdict.grade in ("direction holds", "direction fails"), verdict.reason
        path = REPO / "models" / "predictors" / file
        counts = counted(path)
        names = path.read_text().splitlines()[1].split()[2:]
        share = counts[names.index(feature)] / sum(counts.values())
        assert f"{feature} {100 * share:.1f} % of the splits" in verdict.measured_text
        assert verdict.evidence.model.startswith(f"the trees {file}")
