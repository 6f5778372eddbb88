"""The prefill importance check (claim 000-importance-as-prefill-ran): the dump's parser on a
hand-written file, the numpy recompute on cases worked out by hand, and on real lmc runs each
readout matching the recompute of its own prefill mode and not the other's, through both of
lmc's sparse prefill paths (a tile of queries at a time, and query by query), GQA and q8 KV.
(tests/audit/test_mutants.py judges the claim against the mutant importance-exact.)"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.verify.engine_checks import build_mutant
from harness.verify.importance_check import prefill_figures
from reports.audit.checks_importance import recompute_importance
from reports.audit.importance_dump import parse_importance_dump
from reports.errors import ReportInputError

# 1 layer, 2 query heads over 1 KV head, head_dim 2, blocks of 2, 3 positions. Head 0's query 1
# scores key 1 at ln 3 (q.k / sqrt(2) with q = (sqrt(2) ln 3, 0), k = (1, 0)) and key 0 at 0:
# probabilities 1/4, 3/4; every other query is zero, so uniform over what it sees.
LN3_SQRT2 = f"{math.sqrt(2) * math.log(3):.9g}"
DUMP = f"""# hand-written
shape 1 2 1 2 2 3 sparse
importance 0 3.08333333 1.58333333 1.33333333
q 0 0 0 0
q 0 1 0 0
q 1 0 {LN3_SQRT2} 0
q 1 1 0 0
q 2 0 0 0
q 2 1 0 0
k 0 0 0 0
k 1 0 1 0
k 2 0 0.5 -2
blocks 0 0 1 0
blocks 0 1 1 0
blocks 1 0 1 0
blocks 1 1 1 0
blocks 2 0 1 1
blocks 2 1 2 0 1
"""


def test_the_parser_reads_a_hand_written_dump() -> None:
    dump = parse_importance_dump(DUMP)
    assert dump.prefill == "sparse" and dump.block == 2 and dump.positions == 3
    assert dump.importance.shape == (1, 3)
    assert dump.q.shape == (3, 2, 2) and dump.k.shape == (3, 1, 2)
    assert dump.k[2, 0].tolist() == [0.5, -2.0]
    assert dump.blocks is not None
    assert dump.blocks[2] == [(1,), (0, 1)]


def test_the_recompute_on_hand_worked_cases() -> None:
    dump = parse_importance_dump(DUMP)
    # exact: head 0 (query 0: [1]; query 1: [1/4, 3/4]; query 2: thirds), head 1 (uniform)
    exact = np.array([1 + 0.25 + 1 / 3, 0.75 + 1 / 3, 1 / 3]) + np.array(
        [1 + 0.5 + 1 / 3, 0.5 + 1 / 3, 1 / 3])
    assert np.allclose(recompute_importance(dump, None), exact, rtol=1e-6)
    # sparse: query 2 of head 0 sees block 1 alone (position 2, block 1's only visible row);
    # head 1's query 2 sees blocks 0 and 1: all three positions
    sparse = np.array([1 + 0.25, 0.75, 1.0]) + np.array([1 + 0.5 + 1 / 3, 0.5 + 1 / 3, 1 / 3])
    assert np.allclose(recompute_importance(dump, dump.blocks), sparse, rtol=1e-6)
    assert np.allclose(dump.importance[0], sparse, rtol=1e-7)  # what this dump "recorded"
    assert sparse.sum() == pytest.approx(6.0)  # 2 heads x 3 queries, each summing to 1


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("shape 1 2 1 2 2 3 sparse\n", ""), "no 'shape' line"),
    (lambda t: t.replace("sparse\n", "dense\n", 1), "bad shape line"),
    (lambda t: t.replace("q 2 1 0 0\n", ""), "5 'q' lines, expected 6"),
    (lambda t: t.replace("k 2 0 0.5 -2", "k 2 0 0.5"), "1 values, expected 2"),
    (lambda t: t.replace("k 2 0", "k 3 0"), "outside the shape"),
    (lambda t: t.replace("q 2 1", "q 2 0"), "given twice"),
    (lambda t: t.replace("blocks 2 1 2 0 1", "blocks 2 1 3 0 1"), "3 values, expected 4"),
    (lambda t: t.replace("importance 0 3.08", "importance 0 x"), "could not convert"),
    (lambda t: t + "v 0 0 1 1\n", "unknown or short line"),
    (lambda t: t.replace("shape 1 2 1 2", "shape 1 2 1 two"), r"shape line: invalid literal"),
    (lambda t: t.replace("q 2 1", "q 2 b"), r"line \d+ \(q\): invalid literal"),
    (lambda t: t.replace("blocks 2 1 2 0 1", "blocks 2 1 two 0 1"), r"\(blocks\): invalid literal"),
])
def test_the_parser_names_what_is_wrong(edit, message: str) -> None:
    with pytest.raises(ReportInputError, match=message):
        parse_importance_dump(edit(DUMP))


IDS = [int(t) for t in np.random.default_rng(7).integers(3, 300, 300)]


@pytest.mark.parametrize("model_name, flags", [
    ("needle-tiny", []),                      # the claim's setting: sparse prefill in tiles
    ("needle-tiny", ["--probe-summary"]),     # sparse prefill query by query
    ("gqa4_untied_f32_old", ["--threads", "2"]),  # 8 query heads over 2 KV heads
    ("gqa4_untied_f32_old", ["--kv", "q8"]),      # keys as the q8 cache holds them
])
def test_the_readout_matches_its_own_prefill_mode_only(lmc: Path, needle_model: Path,
                                                       tiny_model, model_name: str,
                                                       flags: list[str]) -> None:
    model = needle_model if model_name == "needle-tiny" else tiny_model(model_name)
    figures, _ = prefill_figures(lmc, model, IDS, 4, flags)
    assert figures.positions == len(IDS)
    for mode in ("exact", "sparse"):
        assert figures.own[mode] < 1e-5, (mode, figures)
        assert figures.other[mode] > 0.05, (mode, figures)
    assert figures.separation > 0.05


def test_the_mutant_records_the_other_mode(needle_model: Path) -> None:
    """What flips the claim on the mutant importance-exact: its sparse prefill's readout is
    exact attention's (the other mode's recompute), its exact prefill's is still its own."""
    figures, _ = prefill_figures(build_mutant("importance-exact"), needle_model, IDS, 4, [])
    assert figures.own["exact"] < 1e-5 < 0.05 < figures.own["sparse"], figures
    assert figures.other["sparse"] < 1e-5, figures
