"""Experiment specs (``specs/*.toml``): load, validate, and turn into plain records.

A spec names a model, the workloads with their axes, the engine axes, the engine revisions, the
devices, and how often to repeat. Every error names the file, the key and what is allowed, and is
raised before anything runs. Any axis may be written as a scalar or a list of values.

Policy-specific axes (``k``, ``block``, ``probes``) live under ``[engine.policy.<name>]`` so that
they can only cross with their own policy: ``exact`` takes none of them. ``kv_budget`` (positions
each head keeps, ``lmc --kv-budget``: eviction for good instead of per-query selection) is an
axis of the policies that can evict (``EVICTING``). ``gbm`` needs ``predictor``, a tree file
(``lmc-gbm``, written by ``benchfarm predictor study``) relative to the spec's folder: it is an
artifact named by its sha256, which is part of the run's config (and so of its run key).
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.build import sha256_file
from harness.engines.llamabench import SECTION as LLAMA_SECTION
from harness.engines.llamabench import LlamaBenchAxes, parse_section
from harness.errors import InputError
from harness.workloads.text import DEFAULT_NEEDLE, NeedleTemplate, TextFiller

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
POLICIES = ("exact", "sparse", "window", "h2o", "quest", "random", "oracle", "h2o-prev", "gbm")
# The policies lmc can evict by (--kv-budget; engine/attend.c attention_can_evict).
EVICTING = ("window", "h2o", "h2o-prev", "gbm", "random", "sparse", "quest", "oracle")
KV_FORMATS = ("f32", "q8")
WQ_FORMATS = ("f32", "q8", "bf16")  # bf16: BF16 weight files kept as stored
PREFILL_ATTN = ("exact", "sparse")
WORKTREE = "worktree"  # the revision name of the engine sources in the working tree

# Defaults of the policy-specific axes when a non-exact policy names none.
POLICY_AXIS_DEFAULTS = {"k": 32, "block": 32, "probes": 8}
# Engine switches as spec axes of true/false: the policies that take each, and the engine's
# default (a value equal to it is the same run as no axis, so run keys do not change).
SWITCHES: dict[str, tuple[tuple[str, ...], bool]] = {
    "importance": (("sparse",), True),  # false: --no-importance
    "recency": (("sparse", "h2o", "quest", "random"), True),  # false: --no-recency
    "probe_summary": (("sparse",), False),  # true: --probe-summary
    "ref_attn": (("exact",), False),  # true: --ref-attn
}

# Per workload kind: its axes (crossed) and its scalar settings, with defaults (None = required).
WORKLOAD_AXES: dict[str, dict[str, Any]] = {
    "needle": {"ctx": None, "depth": [0.5], "seed": [0]},
    "ppl": {"length": None, "seed": [0]},
    "decode": {"ctx": None, "seed": [0]},
    "attn-bench": {"ctx": None, "heads": [16], "kv_heads": [8], "head_dim": [128]},
}
WORKLOAD_SETTINGS: dict[str, dict[str, Any]] = {
    "needle": {"max_new": 16},
    "ppl": {"text": None},  # None: optional, left out of the workload's parameters when absent
    "decode": {"max_new": 32},
    "attn-bench": {"runs": 5, "seed": 0},
}
# Per workload kind: its own text, set only where a spec wants it (a path to a plain-text filler
# file, relative to the spec's folder, instead of the built-in grammar; the needle sentence and
# its question, as harness.workloads.NeedleTemplate takes them).
WORKLOAD_TEXT: dict[str, tuple[str, ...]] = {
    "needle": ("filler", "needle", "question"), "ppl": ("filler",), "decode": ("filler",),
    "attn-bench": (),
}
TOP_LEVEL_KEYS = {
    "name", "description", "model", "devices", "revisions", "repeats", "warmups", "cooldown_s",
    "retries", "backoff_s", "order_seed", "timeout_s", "engine", "workload", "engines",
    LLAMA_SECTION,
}
ENGINE_NAMES = ("lmc", "llama-bench")  # harness.engines.ENGINES; a spec runs one or several
ENGINE_KEYS = {"policy", "kv", "wq", "threads", "prefill_attn", "measure_selection",
               "trace_selection", "measure_keys"}


@dataclass(frozen=True)
class WorkloadAxes:
    """One ``[[workload]]`` table: its kind, its axes (lists, crossed) and scalar settings."""

    kind: str
    axes: dict[str, list[Any]]
    settings: dict[str, Any]


@dataclass(frozen=True)
class PolicyAxes:
    name: str
    k: list[int | None]
    block: list[int | None]
    probes: list[int | None]
    # switch name -> values; None is the engine's default (see SWITCHES)
    switches: dict[str, list[bool | None]] = field(default_factory=dict)
    kv_budget: list[int | None] = field(default_factory=lambda: [None])  # None: no eviction
    predictor: Predictor | None = None  # gbm's trees


@dataclass(frozen=True)
class Predictor:
    """gbm's tree file: where the coordinator has it, and its content's identity."""

    path: Path
    sha256: str


@dataclass(frozen=True)
class EngineAxes:
    policies: list[PolicyAxes]
    kv: list[str]
    wq: list[str]
    threads: list[int] | None  # None: each device's own `threads`
    prefill_attn: list[str]
    measure_selection: bool
    trace_selection: bool = False  # generate and attn-bench runs keep the selected blocks
    # ppl runs of the evicting policies rank the keys of every N-th query (lmc --measure-keys)
    measure_keys: int | None = None


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


class _Checker:
    """Validation helpers that prefix every message with the file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, message: str) -> InputError:
        return InputError(f"{self.path}: key '{key}': {message}")

    def table(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            prefix = f"{key}." if key else ""
            raise self.fail(prefix + unknown[0],
                            f"unknown key; allowed: {', '.join(sorted(allowed))}")
        return value

    def scalar(self, value: Any, key: str, kind: str) -> Any:
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(key, f"must be an integer, got {value!r}")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.fail(key, f"must be a number, got {value!r}")
            if not math.isfinite(value):  # nan passes every range check; inf never ends
                raise self.fail(key, f"must be a finite number, got {value!r}")
            value = float(value)
        elif kind == "str":
            if not isinstance(value, str):
                raise self.fail(key, f"must be a string, got {value!r}")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def minimum(self, value: Any, key: str, low: float) -> Any:
        if value < low:
            raise self.fail(key, f"must be >= {low:g}, got {value!r}")
        return value

    def axis(self, value: Any, key: str, kind: str, low: float | None = None,
             choices: tuple[str, ...] | None = None, high: float | None = None) -> list[Any]:
        """A scalar or a non-empty list of distinct values, each checked."""
        values = value if isinstance(value, list) else [value]
        if not values:
            raise self.fail(key, "must not be an empty list")
        checked = []
        for item in values:
            item = self.scalar(item, key, kind)
            if choices is not None and item not in choices:
                raise self.fail(key, f"unknown value {item!r}; allowed: {', '.join(choices)}")
            if low is not None and item < low:
                raise self.fail(key, f"values must be >= {low:g}, got {item!r}")
            if high is not None and item > high:
                raise self.fail(key, f"values must be <= {high:g}, got {item!r}")
            if item in checked:
                raise self.fail(key, f"value {item!r} is listed twice")
            checked.append(item)
        return checked


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
    check = _Checker(path)
    check.table(data, "", TOP_LEVEL_KEYS)

    if "name" not in data:
        raise check.fail("name", "required (the experiment name)")
    name = check.scalar(data["name"], "name", "str")
    if not NAME_RE.match(name):
        raise check.fail("name", f"{name!r} is not allowed; use [a-z0-9][a-z0-9._-]*")

    workloads = _workloads(check, data.get("workload"))
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
        engine=_engine(check, data.get("engine", {})),
        workloads=workloads,
        engines=engines,
        llama_bench=llama_bench,
    )


def _workloads(check: _Checker, value: Any) -> list[WorkloadAxes]:
    if value is None:
        raise check.fail("workload", "at least one [[workload]] table is required; kinds: "
                         + ", ".join(WORKLOAD_AXES))
    if not isinstance(value, list):
        raise check.fail("workload", "must be an array of tables ([[workload]])")
    result = []
    for index, table in enumerate(value):
        key = f"workload[{index}]"
        if not isinstance(table, dict):
            raise check.fail(key, "must be a table")
        kind = check.scalar(table.get("kind", ""), f"{key}.kind", "str")
        if kind not in WORKLOAD_AXES:
            raise check.fail(f"{key}.kind",
                             f"unknown kind {kind!r}; allowed: {', '.join(WORKLOAD_AXES)}")
        axes_spec, settings_spec = WORKLOAD_AXES[kind], WORKLOAD_SETTINGS[kind]
        check.table(table, key, {"kind", *axes_spec, *settings_spec, *WORKLOAD_TEXT[kind]})
        axes: dict[str, list[Any]] = {}
        for axis, default in axes_spec.items():
            if axis not in table and default is None:
                raise check.fail(f"{key}.{axis}", f"required for {kind} workloads")
            raw = table.get(axis, default)
            if axis == "depth":
                axes[axis] = check.axis(raw, f"{key}.{axis}", "float", low=0.0, high=1.0)
            else:
                low = 0 if axis == "seed" else 1
                axes[axis] = check.axis(raw, f"{key}.{axis}", "int", low=low)
        settings = {}
        for setting, default in settings_spec.items():
            if setting == "text":
                if setting in table:
                    settings[setting] = _text_file(check, table[setting], f"{key}.{setting}")
                continue
            low = 0 if setting == "seed" else 1
            settings[setting] = check.minimum(
                check.scalar(table.get(setting, default), f"{key}.{setting}", "int"),
                f"{key}.{setting}", low)
        settings.update(_workload_text(check, table, key, kind))
        if kind == "attn-bench":
            for heads, kv_heads in ((h, g) for h in axes["heads"] for g in axes["kv_heads"]):
                if heads % kv_heads:
                    raise check.fail(f"{key}.kv_heads",
                                     f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        result.append(WorkloadAxes(kind=kind, axes=axes, settings=settings))
    return result


def _text_file(check: _Checker, value: Any, key: str) -> str:
    """A text file named relative to the spec's folder, as an absolute path."""
    given = check.scalar(value, key, "str")
    path = (check.path.parent / given).resolve()
    if not path.is_file():
        raise check.fail(key, f"{given!r} (resolved relative to the spec's folder to {path}) "
                         "is not a file")
    return str(path)


def _engine(check: _Checker, value: Any) -> EngineAxes:
    table = check.table(value, "engine", ENGINE_KEYS)
    policy_table = check.table(table.get("policy", {"exact": {}}), "engine.policy", set(POLICIES))
    if not policy_table:
        raise check.fail("engine.policy", f"name at least one policy; allowed: "
                         f"{', '.join(POLICIES)}")
    policies = []
    for name in POLICIES:  # a fixed order keeps expansion independent of the file's order
        if name not in policy_table:
            continue
        key = f"engine.policy.{name}"
        axes = policy_table[name]
        switches = {switch for switch, (takers, _) in SWITCHES.items() if name in takers}
        if name == "exact":
            if not isinstance(axes, dict):
                raise check.fail(key, "must be a table")
            bad = sorted(set(axes) - switches)
            if bad:
                raise check.fail(f"{key}.{bad[0]}", "exact attention takes no policy axes but "
                                 f"{', '.join(sorted(switches))} (k, block and probes apply to "
                                 "the non-exact policies only)")
            policies.append(PolicyAxes(name, [None], [None], [None],
                                       _switches(check, axes, key, switches)))
            continue
        own = {"kv_budget"} if name in EVICTING else set()
        axes = check.table(axes, key, set(POLICY_AXIS_DEFAULTS) | switches | own
                           | ({"predictor"} if name == "gbm" else set()))
        values = {
            axis: check.axis(axes.get(axis, default), f"{key}.{axis}", "int", low=1)
            for axis, default in POLICY_AXIS_DEFAULTS.items()
        }
        kv_budget: list[int | None] = [None]
        if "kv_budget" in axes:
            kv_budget = list(check.axis(axes["kv_budget"], f"{key}.kv_budget", "int", low=1))
            small = [b for b in kv_budget for blk in values["block"] if b < blk]
            if small:
                raise check.fail(f"{key}.kv_budget", f"{small[0]} positions is less than one "
                                 f"block ({max(values['block'])}); a budget keeps whole blocks")
        policies.append(PolicyAxes(name, values["k"], values["block"], values["probes"],
                                   _switches(check, axes, key, switches), kv_budget,
                                   _predictor(check, axes, key) if name == "gbm" else None))
    threads = None
    if "threads" in table:
        threads = check.axis(table["threads"], "engine.threads", "int", low=1)
    return EngineAxes(
        policies=policies,
        kv=check.axis(table.get("kv", "f32"), "engine.kv", "str", choices=KV_FORMATS),
        wq=check.axis(table.get("wq", "f32"), "engine.wq", "str", choices=WQ_FORMATS),
        threads=threads,
        prefill_attn=check.axis(table.get("prefill_attn", "exact"), "engine.prefill_attn", "str",
                                choices=PREFILL_ATTN),
        measure_selection=check.scalar(table.get("measure_selection", False),
                                       "engine.measure_selection", "bool"),
        trace_selection=check.scalar(table.get("trace_selection", False),
                                     "engine.trace_selection", "bool"),
        measure_keys=check.minimum(check.scalar(table["measure_keys"], "engine.measure_keys",
                                                "int"), "engine.measure_keys", 1)
        if "measure_keys" in table else None,
    )


def _predictor(check: _Checker, axes: dict[str, Any], key: str) -> Predictor:
    """gbm's required tree file, named relative to the spec's folder, and its sha256."""
    if "predictor" not in axes:
        raise check.fail(f"{key}.predictor", "gbm needs its trees: a predictor file (lmc-gbm) "
                         "relative to the spec's folder, e.g. one `benchfarm predictor study` "
                         "wrote (reports/<study>/predictor-cascade.gbm)")
    path = Path(_text_file(check, axes["predictor"], f"{key}.predictor"))
    if not path.read_bytes().startswith(b"lmc-gbm "):
        raise check.fail(f"{key}.predictor", f"{path} is not an lmc-gbm predictor file (it "
                         "does not start with 'lmc-gbm'); `benchfarm predictor study` writes one")
    return Predictor(path, sha256_file(path))


def _switches(check: _Checker, axes: dict[str, Any], key: str,
              names: set[str]) -> dict[str, list[bool | None]]:
    """The switch axes a policy table sets, the engine's default value written as None."""
    found = {}
    for name in sorted(names & set(axes)):
        default = SWITCHES[name][1]
        values = check.axis(axes[name], f"{key}.{name}", "bool")
        found[name] = [None if value == default else value for value in values]
    return found


def _workload_text(check: _Checker, table: dict[str, Any], key: str, kind: str) -> dict[str, str]:
    """The text settings a workload table sets away from the defaults, checked; left out when
    at the default, so that a workload keeps its identity (and its runs their keys)."""
    found: dict[str, str] = {}
    for name in WORKLOAD_TEXT[kind]:
        value = check.scalar(table.get(name, ""), f"{key}.{name}", "str")
        if name == "filler" and value not in ("", "grammar"):
            value = str((check.path.parent / value).resolve())
            try:
                TextFiller(value)  # readable, UTF-8, holds sentences
            except InputError as exc:
                raise check.fail(f"{key}.{name}", str(exc)) from None
        if value not in ("", "grammar", getattr(DEFAULT_NEEDLE, name, None)):
            found[name] = value
    try:
        NeedleTemplate(needle=found.get("needle", DEFAULT_NEEDLE.needle),
                       question=found.get("question", DEFAULT_NEEDLE.question))
    except InputError as exc:
        raise check.fail(f"{key}.{'needle' if 'needle' in found else 'question'}", str(exc)
                         ) from None
    return found
