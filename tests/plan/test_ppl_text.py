"""Perplexity on a text file from the spec, and the audit's guard: a perplexity claim is only
judged on a model that predicts the workload's text (real lmc runs through Ray and the store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import InputError
from harness.spec import parse_spec
from harness.workloads import load_tokenizer, ppl_tokens

MODELS = Path(__file__).resolve().parents[2] / "models"
LM, NEEDLE = MODELS / "pydoc-lm", MODELS / "needle-tiny"
HELDOUT = LM / "heldout.txt"


def test_text_windows_follow_the_file_and_name_it_when_short(tmp_path: Path) -> None:
    ids = load_tokenizer(LM).encode(HELDOUT.read_text(encoding="utf-8"))
    first, second = (ppl_tokens(LM, 300, seed=s, text=HELDOUT).ids for s in (0, 1))
    assert first + second == ids[:600]
    short = tmp_path / "short.txt"
    short.write_text("def f(x):\n    return x\n" * 20)
    with pytest.raises(InputError, match=r"short\.txt: \d+ tokens hold \d+ windows of 300"):
        ppl_tokens(LM, 300, seed=5, text=short)


def test_spec_text_is_resolved_from_the_spec_folder_and_checked(tmp_path: Path) -> None:
    (tmp_path / "held.txt").write_text("some text\n")
    base = f'name = "t"\nmodel = "{LM}"\n[[workload]]\nkind = "ppl"\nlength = 64\n'
    spec = parse_spec(base + 'text = "held.txt"\n', tmp_path / "spec.toml")
    assert spec.workloads[0].settings["text"] == str(tmp_path / "held.txt")
    assert "text" not in parse_spec(base, tmp_path / "spec.toml").workloads[0].settings
    with pytest.raises(InputError, match=r"spec\.toml: key 'workload\[0\]\.text': 'gone\.txt'"):
        parse_spec(base + 'text = "gone.txt"\n', tmp_path / "spec.toml")


CLAIMS = f"""
source = "test"

[experiment.ppl-guard]
repeats = 1
warmups = 0
[experiment.ppl-guard.engine]
prefill_attn = "sparse"
[experiment.ppl-guard.engine.policy.exact]
[experiment.ppl-guard.engine.policy.window]
k = 2
[[experiment.ppl-guard.workload]]
kind = "ppl"
length = 256
text = "{HELDOUT}"

[[claim]]
id = "window-cost"
statement = "a quarter of the KV (window) costs perplexity against exact"
metric = "ppl_change"
at_least = -100.0
experiment = "ppl-guard"
measure = {{ a = {{ policy = "exact" }}, b = {{ policy = "window", k = 2 }} }}
"""


def test_ppl_claims_are_judged_only_on_a_model_that_predicts_the_text(
        tmp_path: Path, ray_address: str, capsys: pytest.CaptureFixture) -> None:
    from harness.cli import main

    claims = tmp_path / "claims.toml"
    claims.write_text(CLAIMS)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    verdicts = {}
    for model in (NEEDLE, LM):
        out = tmp_path / model.name
        argv = ["--db", f"sqlite:///{tmp_path}/audit.db", "audit", str(claims), "--model",
                str(model), "--inventory", str(inventory), "--ray-address", ray_address,
                "--out", str(out)]
        assert main(argv) == 0, capsys.readouterr().err
        verdicts[model.name] = json.loads((out / "audit.json").read_text())[0]
    needle, lm = verdicts["needle-tiny"], verdicts["pydoc-lm"]
    assert needle["verdict"] == "not comparable"
    assert "does not predict this text" in needle["reason"] and "uniform" in needle["reason"]
    # judged on the model that predicts the text (one window: no noise to call a relation by,
    # so it is inconclusive rather than reproduced), on the two runs compared
    assert lm["verdict"] == "inconclusive" and lm["measured"] is not None
    assert len(lm["evidence"]["runs"]) == 2
