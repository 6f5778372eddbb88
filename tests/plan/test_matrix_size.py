"""The matrix size cap and `benchfarm run --dry-run`: counted without expanding, refused above
the limit with the count, and estimated from the durations of runs in a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_db import add_refs, sample_result

from db import Store
from devices.inventory import Device
from harness import REPO_ROOT
from harness.cli import main
from harness.plan.matrix import count_cells, expand, resolve_placements
from harness.spec import load_spec

SPEC = """name = "size"
model = "{model}"
devices = {devices}
repeats = {repeats}
cooldown_s = 0.5
[engine]
kv = ["f32", "q8"]
wq = ["f32", "q8"]
prefill_attn = ["exact", "sparse"]
[engine.policy.exact]
[engine.policy.sparse]
k = {k}
block = [16, 32]
[[workload]]
kind = "needle"
ctx = {ctx}
depth = {depth}
seed = [0, 1]
[[workload]]
kind = "attn-bench"
ctx = [4096]
heads = [8, 16]
"""


def write_spec(folder: Path, devices: str = '["local"]', repeats: int = 2, k: str = "[1, 4]",
               ctx: str = "[128, 256]", depth: str = "[0.5]") -> Path:
    """The spec, on the shipped needle model (run and its dry run read the model's files)."""
    path = folder / "spec.toml"
    path.write_text(SPEC.format(model=REPO_ROOT / "models" / "needle-tiny", devices=devices,
                                repeats=repeats, k=k, ctx=ctx, depth=depth))
    return path


def devices() -> list[Device]:
    return [Device(name="local", host="", arch="x86_64", cls="x86", threads=2),
            Device(name="b1", host="h", arch="aarch64", cls="rk3588", threads=4),
            Device(name="b2", host="h", arch="aarch64", cls="rk3588", threads=4)]


@pytest.mark.parametrize("selectors", [["local"], ["rk3588"], ["local", "b1", "b2"]])
def test_the_count_is_the_expanded_size(tmp_path: Path, selectors: list[str]) -> None:
    spec = load_spec(write_spec(tmp_path))
    placements = resolve_placements(spec, devices(), selectors)
    counts = count_cells(spec, placements)
    cells = expand(spec, placements)
    assert sum(counts.values()) == len(cells)
    for placement in placements:
        assert counts[placement.key] == sum(c.placement == placement for c in cells)


def test_a_huge_matrix_is_refused_at_once_with_its_count(tmp_path: Path, capsys,
                                                          sqlite_url: str) -> None:
    values = ", ".join(str(v) for v in range(1, 101))
    path = write_spec(tmp_path, repeats=100, k=f"[{values}]", ctx=f"[{values}]",
                      depth="[0.0, 0.25, 0.5, 0.75, 1.0]")
    spec = load_spec(path)
    placements = resolve_placements(spec, devices(), ["local"])
    expected = sum(count_cells(spec, placements).values())
    assert expected > 10**7
    for extra in ([], ["--dry-run"]):
        code = main(["--db", sqlite_url, "run", str(path), *extra])
        err = capsys.readouterr().err
        assert code == 2 and f"the matrix has {expected} runs" in err and "--max-runs" in err
    with Store.open(sqlite_url) as store:
        assert store.list_experiments() == []  # refused before anything was stored
    with pytest.raises(SystemExit) as caught:
        main(["--db", sqlite_url, "run", str(path), "--max-runs", "0"])
    assert caught.value.code == 2 and "--max-runs" in capsys.readouterr().err


def test_dry_run_estimates_from_stored_durations(tmp_path: Path, capsys,
                                                 sqlite_url: str) -> None:
    path = write_spec(tmp_path, devices='["local"]', repeats=1, k="[4]", ctx="[256]")
    spec = load_spec(path)
    per_run_s = {("generate", "sparse", 4): [1.0, 2.0, 9.0],  # median 2.0
                 ("generate", "exact", None): [4.0]}
    with Store.open(sqlite_url) as store:
        refs = add_refs(store, device="local")  # its workload is a needle at ctx 256
        for (command, policy, k), seconds in per_run_s.items():
            for i, s in enumerate(seconds):
                store.save_run(sample_result(
                    refs, f"{policy}{i}".ljust(64, "0"), command=command, policy=policy, k=k,
                    wall_ms=s * 1000, config={"workload": {"ctx": 256, "depth": 0.5}}))
    assert main(["--db", sqlite_url, "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    spec_cells = expand(spec, resolve_placements(spec, devices(), ["local"]))
    needle = [c for c in spec_cells if c.workload.kind == "needle"]
    known = {"sparse": 2.0, "exact": 4.0}
    expected_s = sum(known[c.config.policy] + spec.cooldown_s for c in needle)
    # the board's warm-ups of its one build, each timed as the first run it has a time for
    expected_s += spec.warmups * (known[needle[0].config.policy] + spec.cooldown_s)
    assert spec.warmups >= 1
    minutes, seconds = divmod(round(expected_s), 60)
    assert f"experiment size: {len(spec_cells)} runs in the matrix" in out
    # some runs have nothing to go by: the figure is a lower bound
    assert f"estimated time: at least {minutes} min {seconds:02d} s ({len(needle)} of " \
           f"{len(spec_cells)} runs to do estimated" in out
    assert f"{len(spec_cells) - len(needle)} runs have no stored run like them" in out


def test_dry_run_of_the_depth4096_spec_with_llama_bench(tmp_path: Path, capsys,
                                                        sqlite_url: str) -> None:
    """specs/lmc_vs_llamacpp_depth4096.toml is a valid two-engine matrix; a dry run
    of a spec with llama-bench counts and estimates it (it raised on the missing policy)."""
    spec = Path(__file__).resolve().parents[2] / "specs" / "lmc_vs_llamacpp_depth4096.toml"
    text = spec.read_text().replace('devices = ["x86"]', 'devices = ["local"]')
    text = text.replace('"../models/pydoc-lm"', f'"{spec.parents[1] / "models" / "pydoc-lm"}"')
    (tmp_path / "depth.toml").write_text(text)
    assert main(["--db", sqlite_url, "run", str(tmp_path / "depth.toml"), "--dry-run"]) == 0
    # lmc: exact and sparse k=32, llama-bench: q8_0 at depth 4096; 5 repeats each. Nothing
    # stored to go by: the time is unknown, not 0 s
    out = capsys.readouterr().out
    assert "local: 15 runs" in out
    assert "estimated time: unknown (none of the 15 runs to do has a stored run" in out
    assert "0.0 s" not in out


@pytest.mark.parametrize("name", ["lmc_vs_llamacpp.toml", "lmc_vs_llamacpp_depth4096.toml"])
def test_the_count_includes_llama_bench_cells(name: str) -> None:
    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / name)
    placements = resolve_placements(spec, devices(), ["local", "b1"])
    counts = count_cells(spec, placements)
    cells = expand(spec, placements)
    assert any(c.engine == "llama-bench" for c in cells)
    for placement in placements:
        assert counts[placement.key] == sum(c.placement == placement for c in cells)
