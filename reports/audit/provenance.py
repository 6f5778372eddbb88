"""What a verdict rests on, in words: the model, the device, the data and the engine revision of
the runs a check used, with the article's setting beside them.

``provenance(claim, runs, ids)`` reads the flattened runs (reports.runs): the model from the
engine's own document (its ``model_config``: parameters counted from the shapes, layers), the
device from the run's device row and fingerprint, the data from the workloads (how many
distinct inputs, and how many runs of each: the independent units of a figure are the
verdict's own, counted by evidence.units), the revision from the build.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from reports.audit.claim import Claim

NOTHING = "none (nothing ran for this claim)"


@dataclass(frozen=True)
class Provenance:
    model: str
    device: str
    data: str
    revision: str
    article: str  # the article's setting of the figure

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def short(self) -> str:
        """One line for a reason: model; data; device."""
        return f"{self.model}; {self.data}; {self.device}"


def this_host() -> str:
    """The machine a check without runs ran on: the driver's host, its CPU and its load now,
    never emulated."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = f"; load {os.getloadavg()[0]:.2f} (1-minute average)"
    except OSError:
        load = ""
    return f"{platform.node()} ({platform.machine()}, not emulated; {cpu}{load})"


def parameters(config: dict[str, Any]) -> int:
    """Weights of a dense decoder from its shapes (norms left out): embeddings (twice when
    untied), attention q, k, v, o and the SwiGLU MLP of every layer."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv, dim = int(config["num_key_value_heads"]), int(config["head_dim"])
    attention = hidden * dim * (2 * heads + 2 * kv)
    mlp = 3 * hidden * int(config["intermediate_size"])
    embeddings = int(config["vocab_size"]) * hidden * (1 if config.get("tied_embeddings") else 2)
    return embeddings + int(config["num_hidden_layers"]) * (attention + mlp)


def _model_config(raw: Any) -> dict[str, Any] | None:
    try:
        return json.loads(str(raw))["config"]["model_config"]
    except (ValueError, KeyError, TypeError):
        return None


def _model(runs: pd.DataFrame) -> str:
    names = []
    for path, group in runs.groupby(runs["model_path"].fillna(""), sort=True):
        if not path:
            names.append("no model: synthetic q/k/v (attn-bench)")
            continue
        name = Path(str(path).rstrip("/")).name
        config = next((c for c in map(_model_config, group["raw_json"]) if c), None)
        if config is None:
            names.append(name)
            continue
        try:
            size = f"{parameters(config) / 1e6:.2f} M parameters, "
        except (KeyError, TypeError, ValueError):
            size = ""
        names.append(f"{name} ({size}{config.get('num_hidden_layers', '?')} layers)")
    return "; ".join(names)


def _device(runs: pd.DataFrame) -> str:
    out = []
    for name, group in runs.groupby("device", sort=True):
        row = group.iloc[0]
        state = "emulated" if bool(row["emulated"]) else "not emulated"
        cpu = next((c for c in group["cpu"] if c), "CPU not recorded")
        loads = (pd.to_numeric(group["load"], errors="coerce").dropna() if "load" in group
                 else pd.Series(dtype=float))
        load = (f"; load {loads.min():.2f}-{loads.max():.2f} (1-minute average as each run "
                "started)" if len(loads) else "; load not recorded")
        out.append(f"{name} ({row['device_class']}, {state}; {cpu}{load})")
    return "; ".join(out)


def _values(series: pd.Series) -> str:
    seen = sorted({v for v in series if v is not None and v == v}, key=str)
    shown = [str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in seen]
    return "/".join(shown) or "?"


def _data(runs: pd.DataFrame) -> str:
    out = []
    for kind, group in runs.groupby("kind", sort=True):
        inputs = group["workload_id"].nunique()
        params = [json.loads(p) if isinstance(p, str) else {} for p in group["workload_params"]]
        first = params[0] if params else {}
        if kind == "needle":
            what = (f"needle prompts of {_values(group['ctx'])} tokens "
                    f"(seeds {_values(group['seed'])})")
        elif kind == "ppl":
            text = Path(str(first.get("text", "generated text"))).name
            what = (f"windows of {_values(group['length'])} tokens of {text} "
                    f"(seeds {_values(group['seed'])})")
        elif kind == "attn-bench":
            what = (f"synthetic uniform q/k/v (seed {first.get('seed', 0)}), "
                    f"{_values(group['heads'])} heads / {_values(group['kv_heads'])} KV heads / "
                    f"dim {_values(group['head_dim'])}, {_values(group['ctx'])} positions, "
                    f"{first.get('layers') or 1} layer(s)")
        else:
            what = f"{kind} inputs"
        per_input = int(group.groupby(["workload_id", "config"]).size().max())
        out.append(f"{inputs} distinct {what}, {per_input} run(s) of each per config")
    return "; ".join(out)


def _revision(runs: pd.DataFrame) -> str:
    builds = sorted({(str(e), str(r)[:10], str(h)[:10]) for e, r, h in
                     zip(runs["engine"], runs["build_revision"], runs["build_source_hash"],
                         strict=True)})
    return "; ".join(f"{engine} {rev} (source {src})" for engine, rev, src in builds)


def provenance(claim: Claim, runs: pd.DataFrame, ids: list[int]) -> Provenance:
    """The evidence of the runs ``ids`` (all of ``runs`` when none are named)."""
    article = claim.setting or "not stated in the claims file"
    used = runs[runs["run_id"].isin(ids)] if len(runs) and ids else runs
    if used is None or used.empty:
        return Provenance(NOTHING, NOTHING, NOTHING, NOTHING, article)
    return Provenance(model=_model(used), device=_device(used), data=_data(used),
                      revision=_revision(used), article=article)
