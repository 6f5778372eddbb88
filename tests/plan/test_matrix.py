"""Matrix expansion: counts, policy-specific axes, determinism of order and run keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.engines.lmc import check_revisions
from harness.errors import InputError
from harness.plan.matrix import expand, interleave, resolve_placements, run_key
from harness.spec import load_spec

SPEC = """
name = "m"
model = "model"
devices = {devices}
repeats = 2

[engine]
kv = ["f32", "q8"]

[engine.policy.exact]
[engine.policy.sparse]
k = [1, 4, 32]
block = [16, 32]

[[workload]]
kind = "needle"
ctx = [256, 512]
depth = [0.0, 0.5, 1.0]

[[workload]]
kind = "attn-bench"
ctx = 1024
"""


@dataclass
class Board:
    """An inventory entry: only the fields placement reads."""

    name: str
    arch: str
    cls: str
    engine_threads: int


BOARDS = [
    Board("local", "x86_64", "host", 2),
    Board("rk1", "aarch64", "rk3588", 4),
    Board("rk2", "aarch64", "rk3588", 4),
]
BUILD = {"source_hash": "s" * 64, "target": "x86_64", "compiler_version": "gcc 12",
         "cflags": ["-O3"], "ldflags": ["-lm"]}


def load(tmp_path: Path, devices: str = '["local"]'):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(devices=devices))
    return load_spec(path)


def test_expansion_counts_cross_policy_axes_only_with_their_policy(tmp_path: Path) -> None:
    spec = load(tmp_path)
    cells = expand(spec, resolve_placements(spec, BOARDS))
    needle = [c for c in cells if c.workload.kind == "needle"]
    bench = [c for c in cells if c.workload.kind == "attn-bench"]
    # needle: 6 points x (exact: 1 + sparse: 3 k x 2 blocks) x 2 kv x 2 repeats
    assert len(needle) == 6 * (1 + 6) * 2 * 2
    # attn-bench takes kv (its cache format) but no weight format or prefill policy
    assert len(bench) == 1 * (1 + 6) * 2 * 2
    exact = [c for c in needle if c.config.policy == "exact"]
    assert {(c.config.k, c.config.block, c.config.probes) for c in exact} == {(None, None, None)}
    sparse_k = {c.config.k for c in needle if c.config.policy == "sparse"}
    assert sparse_k == {1, 4, 32}
    assert {c.config.threads for c in cells} == {2}  # the device's own threads
    assert all(c.config.wq is None and c.config.prefill_attn is None for c in bench)


def test_expansion_and_keys_are_deterministic(tmp_path: Path) -> None:
    spec = load(tmp_path)
    first = expand(spec, resolve_placements(spec, BOARDS))
    second = expand(load(tmp_path), resolve_placements(spec, BOARDS))
    assert first == second
    keys = [run_key(BUILD, "m" * 64, "w" * 64, c) for c in first]
    assert keys == [run_key(BUILD, "m" * 64, "w" * 64, c) for c in second]
    # every cell has its own key (the workload hash would differ per point in real plans, so
    # hash the point's params in here as the workload hash)
    distinct = {run_key(BUILD, "m" * 64, c.workload.label(), c) for c in first}
    assert len(distinct) == len(first)
    cell = first[0]
    assert run_key(BUILD | {"source_hash": "t" * 64}, "m" * 64, "w", cell) != \
        run_key(BUILD, "m" * 64, "w", cell)
    assert run_key(BUILD, "n" * 64, "w", cell) != run_key(BUILD, "m" * 64, "w", cell)


def test_interleave_is_seeded_and_keeps_repeat_rounds(tmp_path: Path) -> None:
    spec = load(tmp_path)
    cells = expand(spec, resolve_placements(spec, BOARDS))
    order = interleave(cells, seed=7, round_of=lambda c: c.repeat)
    assert order == interleave(cells, seed=7, round_of=lambda c: c.repeat)
    assert order != interleave(cells, seed=8, round_of=lambda c: c.repeat)
    assert sorted(map(id, order)) == sorted(map(id, cells))
    repeats = [c.repeat for c in order]
    assert repeats == sorted(repeats)  # round 0 completes before round 1 starts
    assert order[: len(order) // 2] != cells[: len(order) // 2]


def test_placements_by_name_and_class(tmp_path: Path) -> None:
    spec = load(tmp_path, devices='["local", "rk3588"]')
    local, pool = resolve_placements(spec, BOARDS)
    assert (local.key, local.devices) == ("local", ("local",))
    assert (pool.key, pool.by_class, pool.arch, pool.devices) == \
        ("class:rk3588", True, "aarch64", ("rk1", "rk2"))
    cells = expand(spec, [local, pool])
    assert {c.config.threads for c in cells if c.placement is pool} == {4}
    with pytest.raises(InputError, match="neither a device nor a class.*rk1"):
        resolve_placements(spec, BOARDS, ["rk9"])
    with pytest.raises(InputError, match="listed twice"):
        resolve_placements(spec, BOARDS, ["rk1", "rk1"])


def test_unknown_revision_is_refused_before_anything_runs(tmp_path: Path) -> None:
    spec = load(tmp_path)
    path = spec.path
    path.write_text(path.read_text().replace('repeats = 2', 'repeats = 2\nrevisions = '
                                             '["worktree", "HEAD", "no-such-rev"]'))
    with pytest.raises(InputError, match=r"key 'revisions': 'no-such-rev' is not a git revision"):
        check_revisions(load_spec(path))


def test_a_build_is_named_without_building_it(engine_build, engine_build_aarch64,
                                              tmp_path: Path) -> None:
    # what `audit --stored-only` keys runs by: the same identity as the real build, for each
    # target and for a git revision, while nothing is compiled or written
    from dataclasses import asdict

    from harness.engines.lmc.build import build_identity

    for built in (engine_build, engine_build_aarch64):
        named = build_identity(built.target)
        for field in ("source_hash", "target", "isa", "compiler_version", "cflags",
                      "ldflags", "build_key", "binary"):
            assert getattr(named, field) == getattr(built, field), field
        assert named.binary_sha256 == ""
    empty = tmp_path / "no-builds"
    named = build_identity("x86_64", rev="HEAD", build_root=empty)
    assert not empty.exists() and named.binary.startswith(f"{empty}/x86_64-{named.isa}-release-")
    assert len(named.revision) == 40 and len(named.source_hash) == 64  # HEAD's commit, exported
    assert set(asdict(named)) == set(asdict(engine_build))


def test_attn_bench_layers_reach_the_engine_and_keep_old_keys(tmp_path: Path, lmc: Path) -> None:
    """An attn-bench workload's optional `layers` (KV from memory, as in decode) becomes lmc's
    --layers; a workload without it keeps its parameters, so its runs keep their keys."""
    from harness.engines.lmc import options, run_here

    def bench_cells(extra: str) -> list:
        (tmp_path / "model").mkdir(exist_ok=True)
        (tmp_path / "model" / "config.json").write_text("{}")
        path = tmp_path / "spec.toml"
        text = SPEC.format(devices='["local"]')
        path.write_text(text.replace("ctx = 1024", "ctx = 1024" + extra))
        spec = load_spec(path)
        return [c for c in expand(spec, resolve_placements(spec, BOARDS))
                if c.workload.kind == "attn-bench"]

    plain, layered = bench_cells(""), bench_cells("\nlayers = 3\nheads = 4\nkv_heads = 2")
    assert all("layers" not in dict(c.workload.params) for c in plain)
    assert "--layers" not in options(plain[0].workload, plain[0].config)
    cell = layered[0]
    argv = options(cell.workload, cell.config)
    assert argv[argv.index("--layers") + 1] == "3"
    doc = run_here(lmc, "attn-bench", None, None, argv)
    assert doc["layers"] == 3 and doc["ctx"] == 1024
    with pytest.raises(InputError, match="layers"):
        bench_cells("\nlayers = 0")
