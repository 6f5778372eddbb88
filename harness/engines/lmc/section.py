"""A spec's ``[engine]`` table: lmc's axes (policies, KV and weight formats, threads, prefill
attention) and their validation.

Policy-specific axes (``k``, ``block``, ``probes``) live under ``[engine.policy.<name>]`` so that
they can only cross with their own policy: ``exact`` takes none of them. ``kv_budget`` (positions
each head keeps, ``lmc --kv-budget``: eviction for good instead of per-query selection) is an
axis of the policies that can evict (``EVICTING``). ``gbm`` needs ``predictor``, a tree file
(``lmc-gbm``, written by ``benchfarm predictor study``) relative to the spec's folder: it is an
artifact named by its sha256, which is part of the run's config (and so of its run key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.build import sha256_file
from harness.spec_check import SpecChecker

POLICIES = ("exact", "sparse", "window", "h2o", "quest", "random", "oracle", "h2o-prev", "gbm")
# The policies lmc can evict by (--kv-budget; engine/attend.c attention_can_evict).
EVICTING = ("window", "h2o", "h2o-prev", "gbm", "random", "sparse", "quest", "oracle")
# policies that score keys from token features (lmc's keyfeat.c): generate and ppl only
FEATURE_POLICIES = ("h2o-prev", "gbm")
KV_FORMATS = ("f32", "q8")
WQ_FORMATS = ("f32", "q8", "bf16")  # bf16: BF16 weight files kept as stored
PREFILL_ATTN = ("exact", "sparse")

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
ENGINE_KEYS = {"policy", "kv", "wq", "threads", "prefill_attn", "measure_selection",
               "trace_selection", "measure_keys"}


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


def parse_engine(check: SpecChecker, value: Any) -> EngineAxes:
    """Validate the ``[engine]`` table: lmc's axes, each policy's crossed with that policy only."""
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


def _predictor(check: SpecChecker, axes: dict[str, Any], key: str) -> Predictor:
    """gbm's required tree file, named relative to the spec's folder, and its sha256."""
    if "predictor" not in axes:
        raise check.fail(f"{key}.predictor", "gbm needs its trees: a predictor file (lmc-gbm) "
                         "relative to the spec's folder, e.g. one `benchfarm predictor study` "
                         "wrote (reports/<study>/predictor-cascade.gbm)")
    path = Path(check.relative_file(axes["predictor"], f"{key}.predictor"))
    if not path.read_bytes().startswith(b"lmc-gbm "):
        raise check.fail(f"{key}.predictor", f"{path} is not an lmc-gbm predictor file (it "
                         "does not start with 'lmc-gbm'); `benchfarm predictor study` writes one")
    return Predictor(path, sha256_file(path))


def _switches(check: SpecChecker, axes: dict[str, Any], key: str,
              names: set[str]) -> dict[str, list[bool | None]]:
    """The switch axes a policy table sets, the engine's default value written as None."""
    found = {}
    for name in sorted(names & set(axes)):
        default = SWITCHES[name][1]
        values = check.axis(axes[name], f"{key}.{name}", "bool")
        found[name] = [None if value == default else value for value in values]
    return found

