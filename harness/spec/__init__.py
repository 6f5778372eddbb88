"""Experiment specs (``specs/*.toml``): load, validate, and turn into plain records.

A spec names a model, the workloads with their axes, the engine axes, the engine revisions, the
devices, and how often to repeat. Every error names the file, the key and what is allowed, and is
raised before anything runs. Any axis may be written as a scalar or a list of values.

This module reads the file and its top-level keys; the ``[engine]`` table is validated by
``harness.spec_engine``, the ``[[workload]]`` tables by ``harness.spec_workloads`` and the
``[llama-bench]`` table by ``harness.engines.llamabench``, all with ``harness.spec_check``.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engines.llamabench import SECTION as LLAMA_SECTION
from harness.engines.llamabench import LlamaBenchAxes, parse_section
from harness.errors import InputError
from harness.spec_check import SpecChecker
from harness.spec_engine import FEATURE_POLICIES, EngineAxes, parse_engine
from harness.spec_workloads import WorkloadAxes, parse_workloads

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
WORKTREE = "worktree"  # the revision name of the engine sources in the working tree
TOP_LEVEL_KEYS = {
    "name", "description", "model", "devices", "revisions", "repeats", "warmups", "cooldown_s",
    "retries", "backoff_s", "order_seed", "timeout_s", "engine", "workload", "engines",
    LLAMA_SECTION,
}
ENGINE_NAMES = ("lmc", "llama-bench")  # harness.engines.ENGINES; a spec runs one or several


@dataclass(frozen=True)
class Spec:
    path: Path
    text: str
    hash: str  # sha256 of the spec text
    name: str
    description: str
    model: Path | None  # None only when every workload is `attn-bench`
    devices: list[str]  # device names or device classes
    revisions: list[str]  # WORKTREE or git revisions
    repeats: int
    warmups: int
    cooldown_s: float
    retries: int  # more tries of a run whose board was lost
    backoff_s: float  # first wait before a lost board is tried again; doubles every time
    order_seed: int
    timeout_s: float
    engine: EngineAxes  # lmc's axes (the [engine] table)
    workloads: list[WorkloadAxes] = field(default_factory=list)
    engines: list[str] = field(default_factory=lambda: ["lmc"])
    llama_bench: LlamaBenchAxes | None = None  # the [llama-bench] table


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raise InputError naming the file and key on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read spec {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                         f"offset {exc.start}); TOML files must be UTF-8") from None
    return parse_spec(text, path)


def parse_spec(text: str, path: Path) -> Spec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from exc
    check = SpecChecker(path)
    check.table(data, "", TOP_LEVEL_KEYS)

    if "name" not in data:
        raise check.fail("name", "required (the experiment name)")
    name = check.scalar(data["name"], "name", "str")
    if not NAME_RE.match(name):
        raise check.fail("name", f"{name!r} is not allowed; use [a-z0-9][a-z0-9._-]*")

    workloads = parse_workloads(check, data.get("workload"))
    model = None
    if "model" in data:
        model_text = check.scalar(data["model"], "model", "str")
        model = (path.parent / model_text).resolve()
        if not (model / "config.json").is_file():
            raise check.fail("model", f"{model_text!r} (resolved relative to the spec's folder "
                             f"to {model}) is not a model directory with a config.json")
    elif any(w.kind != "attn-bench" for w in workloads):
        raise check.fail("model", "required for needle, ppl and decode workloads "
                         "(a Hugging Face model directory, relative to the spec's folder)")
    engine = parse_engine(check, data.get("engine", {}))
    featured = [p.name for p in engine.policies if p.name in FEATURE_POLICIES]
    if featured and any(w.kind == "attn-bench" for w in workloads):
        raise check.fail(f"engine.policy.{featured[0]}",
                         f"{featured[0]} scores keys from token features, which attn-bench's "
                         "synthetic data has none of (lmc runs it in generate and ppl only): "
                         "put the attn-bench workload and this policy in separate specs")
    engines = check.axis(data.get("engines", ["lmc"]), "engines", "str", choices=ENGINE_NAMES)
    llama_bench = None
    if "llama-bench" in engines:
        llama_bench = parse_section(check, data.get(LLAMA_SECTION, {}), path.parent)
        if not any(w.kind == "decode" for w in workloads):
            raise check.fail("engines", "llama-bench runs decode workloads (pp<ctx>, "
                             "tg<max_new>): add a [[workload]] of kind = \"decode\"")
    elif LLAMA_SECTION in data:
        raise check.fail(LLAMA_SECTION, "the spec's `engines` does not list llama-bench")

    devices = check.axis(data.get("devices", ["local"]), "devices", "str")
    for device in devices:
        if not NAME_RE.match(device):
            raise check.fail("devices", f"{device!r} is not a device or class name")
    revisions = check.axis(data.get("revisions", [WORKTREE]), "revisions", "str")

    def number(key: str, kind: str, default: Any, low: float) -> Any:
        return check.minimum(check.scalar(data.get(key, default), key, kind), key, low)

    return Spec(
        path=path,
        text=text,
        hash=hashlib.sha256(text.encode()).hexdigest(),
        name=name,
        description=check.scalar(data.get("description", ""), "description", "str"),
        model=model,
        devices=devices,
        revisions=revisions,
        repeats=number("repeats", "int", 1, 1),
        warmups=number("warmups", "int", 1, 0),
        cooldown_s=number("cooldown_s", "float", 0.0, 0),
        retries=number("retries", "int", 2, 0),
        backoff_s=number("backoff_s", "float", 1.0, 0),
        order_seed=number("order_seed", "int", 0, 0),
        timeout_s=number("timeout_s", "float", 900.0, 1),
        engine=engine,
        workloads=workloads,
        engines=engines,
        llama_bench=llama_bench,
    )
