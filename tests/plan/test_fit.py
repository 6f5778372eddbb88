"""A model whose resident weights exceed a board's memory is refused before anything runs
(exit 2, naming both figures): the board's memory as its newest stored fingerprint recorded
it, this machine's for boards on it. A board whose memory is not known yet is not judged."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fixtures_db import add_refs, sample_result

from db import Snapshot, Store
from harness import REPO_ROOT
from harness.cli import main
from harness.engines.lmc.memory import resident_bytes

MODEL = REPO_ROOT / "models" / "needle-tiny"
INVENTORY = """
[[device]]
name = "small"
host = "127.0.0.1"
arch = "x86_64"
class = "x86"
"""
SPEC = f"""name = "fit"
model = "{MODEL}"
devices = ["small"]
[engine]
wq = ["q8", "f32"]
[[workload]]
kind = "decode"
ctx = 32
max_new = 2
"""


def record_memory(url: str, board: str, mem_total_kb: int) -> None:
    """A stored run of ``board`` whose fingerprint recorded ``mem_total_kb``."""
    with Store.open(url) as store:
        refs = add_refs(store, device=board)
        taken = datetime(2026, 12, 1, tzinfo=UTC)
        store.save_run(sample_result(refs, "m" * 64, snapshots=[
            Snapshot("before", {"mem_total_kb": mem_total_kb}, taken)]))


def test_a_model_beyond_the_boards_memory_is_refused_naming_both(tmp_path: Path, capsys,
                                                                 sqlite_url: str) -> None:
    import json

    config = json.loads((MODEL / "config.json").read_text())
    need_f32 = resident_bytes(config, "f32")
    assert resident_bytes(config, "q8") < need_f32
    inventory, spec = tmp_path / "inventory.toml", tmp_path / "spec.toml"
    inventory.write_text(INVENTORY)
    spec.write_text(SPEC)
    args = ["--db", sqlite_url, "run", str(spec), "--inventory", str(inventory)]
    # never fingerprinted: nothing is known of its memory, the plan goes on
    assert main([*args, "--dry-run"]) == 0
    capsys.readouterr()
    # a board with memory for the q8 weights but not the f32 ones
    record_memory(sqlite_url, "small", (resident_bytes(config, "q8") + need_f32) // 2 // 1024)
    for extra in (["--dry-run"], []):
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert "board 'small'" in err and "in lmc at wq f32" in err
        assert f"needs {need_f32 / 1e6:,.1f} MB" in err and "MB of memory (MemTotal)" in err
    # with room for both it plans
    record_memory(sqlite_url, "small", 2 * need_f32 // 1024)
    assert main([*args, "--dry-run"]) == 0
