"""Synthetic experiments with known rows, for the reports, compare and audit tests.

``SyntheticExperiment`` writes complete runs through the real store API (``db.Store``), so the
tests exercise the same read path as real results. Values are chosen by the tests, so the
expected tables are known exactly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from db import Outcome, RunResult, Snapshot, Store, TokenTiming

MODEL_SHA = "e" * 64


def build_record(source_hash: str = "a" * 64, revision: str = "rev-a",
                 binary_sha256: str = "c" * 64, target: str = "x86_64",
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "target": target, "variant": "release", "toolchain": "gcc", "compiler": "gcc",
        "compiler_version": "gcc 12.2.0", "cflags": ["-O3"], "ldflags": ["-lm"],
        "source_hash": source_hash, "revision": revision, "build_key": "k", "binary": "/tmp/lmc",
        "binary_sha256": binary_sha256, "build_seconds": 1.0, "extra": extra or {},
    }


def healthy_fingerprint(governor: str = "performance", temp_c: float = 45.0) -> dict[str, Any]:
    """A fingerprint in the devices.fingerprint schema of an idle, unthrottled machine."""
    return {
        "schema": "benchfarm.fingerprint/1", "arch": "x86_64", "kernel": "6.1.0",
        "cpu_model": "Synthetic CPU", "loadavg": [0.1, 0.1, 0.1],
        "cores": [{"cpu": 0, "online": True, "max_khz": 3000000, "policy_max_khz": 3000000,
                   "cur_khz": 3000000, "governor": governor}],
        "thermal": [{"zone": "thermal_zone0", "type": "cpu", "temp_c": temp_c}],
    }


@dataclass
class SyntheticExperiment:
    store: Store
    name: str = "synthetic"
    spec_text: str = 'name = "synthetic"\n'
    experiment_id: int = 0
    devices: dict[str, int] = field(default_factory=dict)
    builds: dict[str, int] = field(default_factory=dict)
    model_id: int = 0
    count: int = 0

    def __post_init__(self) -> None:
        self.experiment_id = self.store.upsert_experiment(
            self.name, self.spec_text, hashlib.sha256(self.spec_text.encode()).hexdigest())
        self.model_id = self.store.upsert_model("models/tiny", MODEL_SHA, {"model_type": "qwen3"})
        self.add_build("default", build_record())

    def add_device(self, name: str, arch: str = "x86_64", cls: str = "x86",
                   emulated: bool = False) -> int:
        self.devices[name] = self.store.upsert_device(name, arch, cls, emulated, {"host": name})
        return self.devices[name]

    def add_build(self, name: str, record: dict[str, Any]) -> int:
        self.builds[name] = self.store.record_build(record)
        return self.builds[name]

    def run(self, device: str = "local", kind: str = "needle", policy: str | None = "exact",
            k: int | None = None, ctx: int = 256, depth: float = 0.5, seed: int = 0,
            repeat: int = 0, status: str = "ok", decode_ms: float = 10.0,
            attn_ms: float = 4.0, recall: float | None = 1.0, ppl: float | None = None,
            tokens: list[int] | None = None, build: str = "default",
            fingerprint: dict[str, Any] | None = None, threads: int = 2,
            selection_mass: float | None = None, oracle_recall: float | None = None,
            step_ms: list[float] | None = None, bytes_read: int | None = None,
            engine: str = "lmc", prefill_ms: float = 50.0, prefill_attn: str = "exact",
            peak_rss_kb: int | None = None, kv_resident_bytes: int | None = None,
            job_id: int | None = None, raw: dict[str, Any] | None = None,
            switches: dict[str, Any] | None = None) -> int:
        """Store one run (an attempt of job ``job_id``, when given); returns its id. ``raw``:
        the engine's document (default: one naming the context length only); ``switches``:
        engine options of the spec's axes, added to the run's config (``{"bf16_acts": True}``)."""
        if device not in self.devices:
            self.add_device(device)
        self.count += 1
        params: dict[str, Any] = ({"length": ctx, "seed": seed} if kind == "ppl"
                                  else {"ctx": ctx, "depth": depth, "seed": seed})
        content = hashlib.sha256(json.dumps([kind, params], sort_keys=True).encode()).hexdigest()
        workload_id = self.store.upsert_workload(kind, params, content, [1, 2, 3],
                                                 answer="4242" if kind == "needle" else None)
        tokens = tokens if tokens is not None else [5, 6, 7, 8]
        command = {"needle": "generate", "decode": "generate", "ppl": "ppl"}.get(kind, kind)
        steps = step_ms or [decode_ms] * len(tokens)
        timings = ([TokenTiming(i, t, steps[i % len(steps)], attn_ms)
                    for i, t in enumerate(tokens)] if command == "generate" else [])
        ok = status == "ok"
        snapshot = fingerprint or healthy_fingerprint()
        result = RunResult(
            run_key=f"{self.name}-{self.count}", experiment_id=self.experiment_id,
            device_id=self.devices[device], engine=engine, command=command, status=status,
            build_id=self.builds[build], model_id=self.model_id, workload_id=workload_id,
            config={"policy": policy, "k": k} | (switches or {}), policy=policy, k=k,
            block=None if policy == "exact" else 32, probes=None if policy == "exact" else 8,
            kv="f32", wq="f32", threads=threads, prefill_attn=prefill_attn, repeat=repeat,
            exit_code=0 if ok else 2, error=None if ok else "lmc: error: synthetic failure",
            wall_ms=1000.0, engine_ms=900.0, overhead_ms=100.0,
            prefill_ms=prefill_ms if ok else None,
            decode_ms_per_token=decode_ms if ok and command == "generate" else None,
            attn_ms_per_token=attn_ms if ok and command == "generate" else None,
            prompt_tokens=ctx, raw_json=json.dumps({"ctx": ctx} if raw is None else raw),
            token_timings=timings if ok else [],
            outcome=Outcome(generated_ids=tokens if command == "generate" else None,
                            recall=recall if kind == "needle" else None, ppl=ppl,
                            nll=None, selection_mass=selection_mass,
                            oracle_recall=oracle_recall, bytes_read=bytes_read,
                            peak_rss_kb=peak_rss_kb,
                            kv_resident_bytes=kv_resident_bytes) if ok else None,
            snapshots=[Snapshot("before", snapshot), Snapshot("after", snapshot)],
            job_id=job_id,
        )
        return self.store.save_run(result)
