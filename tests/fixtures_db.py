"""Fixtures for the db area: a fresh SQLite store per test and complete sample runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from db import Outcome, RunResult, Snapshot, Store, TokenTiming


@dataclass
class StoreRefs:
    """Ids of one experiment's reference rows, as the coordinator would hold them."""

    experiment_id: int
    device_id: int
    build_id: int
    model_id: int
    workload_id: int


BUILD_RECORD = {
    "target": "x86_64", "variant": "release", "toolchain": "gcc", "compiler": "gcc",
    "compiler_version": "gcc (Debian 12.2.0-14) 12.2.0", "cflags": ["-O3", "-march=x86-64-v3"],
    "ldflags": ["-lm", "-lpthread"], "source_hash": "a" * 64, "revision": "working-tree",
    "build_key": "b" * 16, "binary": "/tmp/lmc", "binary_sha256": "c" * 64,
    "build_seconds": 1.5, "rebuilt": True, "extra": {},
}


def add_refs(store: Store, experiment: str = "exp", device: str = "local") -> StoreRefs:
    return StoreRefs(
        experiment_id=store.upsert_experiment(experiment, f"name = '{experiment}'\n", "h1"),
        device_id=store.upsert_device(device, "x86_64", "x86", False, {"host": "127.0.1.1"}),
        build_id=store.record_build(BUILD_RECORD),
        model_id=store.upsert_model("models/tiny", "d" * 64, {"hidden_size": 64}),
        workload_id=store.upsert_workload("needle", {"ctx": 256, "depth": 0.5, "seed": 1},
                                          "w" * 16, [1, 2, 3, 4], answer="ramen",
                                          needle_span=[1, 3]),
    )


def sample_result(refs: StoreRefs, key: str, status: str = "ok", steps: int = 4,
                  **overrides: object) -> RunResult:
    """A generate run with every field filled (``steps`` decode steps)."""
    start = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    values: dict[str, object] = dict(
        run_key=key, experiment_id=refs.experiment_id, device_id=refs.device_id,
        build_id=refs.build_id, model_id=refs.model_id, workload_id=refs.workload_id,
        command="generate", status=status, config={"attn": "sparse", "k": 4, "threads": 2},
        policy="sparse", k=4, block=32, probes=8, kv="f32", wq="f32", threads=2,
        prefill_attn="exact", repeat=0, attempts=1, exit_code=0 if status == "ok" else 1,
        error=None if status == "ok" else "lmc: error: boom", started_at=start,
        finished_at=start + timedelta(seconds=2), wall_ms=2000.0, engine_ms=1900.0,
        overhead_ms=100.0, prefill_ms=300.0, decode_ms_per_token=12.5, attn_ms_per_token=3.0,
        prompt_tokens=4, raw_json='{"schema": 1}',
        token_timings=[TokenTiming(step=i, token=100 + i, ms=12.0 + i, attn_ms=3.0)
                       for i in range(steps)],
        outcome=Outcome(generated_ids=[100 + i for i in range(steps)], text="ramen",
                        expected_answer="ramen", recall=1.0, selection_mass=0.9,
                        oracle_recall=0.75, max_abs_diff=1e-6, bytes_read=3 * 2**31,
                        extra={"note": "x"}),
        snapshots=[Snapshot("before", {"governor": "performance", "temp_c": 40.0}, start),
                   Snapshot("after", {"governor": "performance", "temp_c": 45.0}, start)],
    )
    values.update(overrides)
    return RunResult(**values)  # type: ignore[arg-type]


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = Store.open(store_url)
    yield opened
    opened.close()


@pytest.fixture
def refs(store: Store) -> StoreRefs:
    return add_refs(store)
