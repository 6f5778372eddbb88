"""reproduce on the local farm: a stored run re-run over SSH with the identical binary."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from db import Store, StoreInputError
from devices.inventory import load_inventory
from harness.engines import adapter_of
from harness.errors import InputError, RunFailure
from harness.execution.coordinator import RunRequest, run_experiment
from harness.spec import load_spec
from harness.verify.reproduce import reproduce, verified_binary

SPEC = """
name = "repro"
devices = ["farm-x86"]
warmups = 0
[engine.policy.sparse]
k = 4
[[workload]]
kind = "attn-bench"
ctx = 512
heads = 4
kv_heads = 2
head_dim = 64
runs = 3
"""


@pytest.fixture
def stored_run(tmp_path: Path, coord_farm, ray_address: str) -> tuple[Store, int]:
    spec = tmp_path / "repro.toml"
    spec.write_text(SPEC)
    store = Store.open(f"sqlite:///{tmp_path}/repro.db")
    inventory = load_inventory(coord_farm.inventory)
    summary = run_experiment(RunRequest(load_spec(spec), inventory, ray_address=ray_address), store)
    assert summary.counts["ok"] == 1
    run_id = int(store.frames("repro")["runs"]["id"].iloc[0])
    yield store, run_id
    store.close()


def test_reproduce_on_the_farm(stored_run: tuple[Store, int], coord_farm) -> None:
    store, run_id = stored_run
    inventory = load_inventory(coord_farm.inventory)
    result = reproduce(store, str(run_id), inventory)
    assert result.status == "ok" and result.device == "farm-x86"
    assert result.identical is None  # attn-bench has timings only
    assert not result.rebuilt
    assert result.original and result.new and result.ratio is not None and result.ratio > 0
    assert f"run {run_id} on farm-x86 (attn-bench): ok" in result.text()

    # The recorded binary is gone: it is rebuilt from its revision and verified by sha256.
    build = store.get_run(run_id).build
    moved = Path(build["binary"]).with_suffix(".moved")
    shutil.move(build["binary"], moved)
    try:
        again = reproduce(store, str(run_id), inventory)
        assert again.rebuilt and again.status == "ok"
        assert again.binary_sha256 == build["binary_sha256"]
    finally:  # put the original back unless the rebuild already wrote the same file
        if Path(build["binary"]).exists():
            moved.unlink()
        else:
            shutil.move(moved, build["binary"])


def test_a_changed_binary_is_refused(stored_run: tuple[Store, int]) -> None:
    store, run_id = stored_run
    build = dict(store.get_run(run_id).build)
    build["binary"] = "/nonexistent/lmc"
    build["binary_sha256"] = "0" * 64  # what no rebuild can give
    with pytest.raises(RunFailure, match="cannot be reproduced with the identical binary"):
        verified_binary(adapter_of(build["engine"]), build)


def test_unknown_device_or_run(stored_run: tuple[Store, int], tmp_path: Path) -> None:
    store, run_id = stored_run
    local_only = tmp_path / "local.toml"
    local_only.write_text('[[device]]\nname = "local"\n')
    with pytest.raises(InputError, match="device 'farm-x86', which is not in the inventory"):
        reproduce(store, str(run_id), load_inventory(local_only))
    with pytest.raises(StoreInputError, match="no run with id or key '999999'"):
        reproduce(store, "999999", load_inventory(local_only))


@pytest.fixture(scope="module")
def random_needle_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen3 with the shipped tokenizer and chat template: real generate runs, fast."""
    from fixtures_engine import TinySpec, build_tiny_model
    from tokenizers import Tokenizer

    shipped = Path(__file__).resolve().parents[2] / "models" / "needle-tiny"
    vocab = Tokenizer.from_file(str(shipped / "tokenizer.json")).get_vocab_size()
    out = build_tiny_model(TinySpec("needle-random", hidden=64, heads=4, kv_heads=2,
                                    head_dim=16, tied=True, dtype="float32", vocab=vocab,
                                    seed=7), tmp_path_factory.mktemp("needle-random"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shipped / name, out / name)
    return out


def test_reproduce_a_generate_run_token_for_token(tmp_path: Path, coord_farm, ray_address: str,
                                                  random_needle_model: Path) -> None:
    spec = tmp_path / "gen.toml"
    spec.write_text(f'name = "gen"\nmodel = "{random_needle_model}"\ndevices = ["farm-x86"]\n'
                    'warmups = 0\n[engine.policy.sparse]\nk = 2\n[[workload]]\nkind = "needle"\n'
                    'ctx = 128\nmax_new = 6\n')
    inventory = load_inventory(coord_farm.inventory)
    with Store.open(f"sqlite:///{tmp_path}/gen.db") as store:
        run_experiment(RunRequest(load_spec(spec), inventory, ray_address=ray_address), store)
        run_id = str(int(store.frames("gen")["runs"]["id"].iloc[0]))
        result = reproduce(store, run_id, inventory)
        assert result.status == "ok" and result.identical is True and result.divergence == ""
        assert result.metric == "decode_ms_per_token" and result.ratio is not None
        with (random_needle_model / "model.safetensors").open("ab") as weights:
            weights.write(b"\0")  # another model now sits at the recorded path
        with pytest.raises(RunFailure, match="restore that model"):
            reproduce(store, run_id, inventory)
