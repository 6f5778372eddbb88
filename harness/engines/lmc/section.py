"""A spec's ``[engine]`` table: lmc's axes (policies, KV and weight formats, threads, prefill
attention) and their validation, in lmc's vocabulary (db.lmc_axes).

Policy-specific axes (``k``, ``block``, ``probes``) live under ``[engine.policy.<name>]`` so that
they can only cross with their own policy: ``exact`` takes none of them. ``kv_budget`` (positions
each head keeps, ``lmc --kv-budget``: eviction for good instead of per-query selection) is an
axis of the policies that can evict. An engine switch is an axis of true/false of the policies
it applies to. ``gbm`` needs ``predictor``, a tree file (``lmc-gbm``, written by ``benchfarm
predictor study``) relative to the spec's folder: an artifact named by its sha256, which is part
of the run's config (and so of its run key).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from db.lmc_axes import DEFAULTS as LMC_DEFAULTS
from db.lmc_axes import (
    EVICTING,
    FEATURE_POLICIES,
    KV_FORMATS,
    POLICY_AXES,
    POLICY_NAMES,
    PREFILL_ATTN,
    SWITCHES,
    WQ_FORMATS,
)
from devices.checker import Checker
from devices.files import read_bytes

SECTION = "engine"  # the spec's table of lmc's axes
MEASURE_KEYS_KEEP = 50  # lmc's --measure-keys-keep default: lost_keep is then lost50
# The most lmc takes of each (its option table in engine/cli.c): a spec asking for more failed
# every run of its matrix at the engine's option check instead of being refused here
LMC_LIMITS = {"threads": 256, "k": 1 << 24, "block": 1 << 20, "probes": 1 << 20,
              "kv_budget": 1 << 24}

ENGINE_KEYS = {"policy", "kv", "wq", "bf16_acts", "threads", "prefill_attn",
               "measure_selection", "trace_selection", "measure_keys", "measure_keys_keep",
               "measure_keys_direct"}
SWITCH_DEFAULTS = {s.name: s.default for s in SWITCHES}


@dataclass(frozen=True)
class Predictor:
    """gbm's tree file: where the coordinator has it, and its content's identity."""

    path: Path
    sha256: str


@dataclass(frozen=True)
class PolicyAxes:
    name: str
    k: list[int | None]
    block: list[int | None]
    probes: list[int | None]
    # switch name -> values; None is the engine's default (see db.lmc_axes.SWITCHES)
    switches: dict[str, list[bool | None]] = field(default_factory=dict)
    kv_budget: list[int | None] = field(default_factory=lambda: [None])  # None: no eviction
    predictor: Predictor | None = None  # gbm's trees


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
    # the budgets (% of keys kept) its lost_keep figure is measured at (--measure-keys-keep)
    measure_keys_keep: list[int] = field(default_factory=lambda: [MEASURE_KEYS_KEEP])
    # recall32_direct's candidates: the top D of all keys (--measure-keys-direct; None: off)
    measure_keys_direct: int | None = None
    # lmc --bf16-acts: bf16 weight products take activations rounded to bf16 (wq bf16 only)
    bf16_acts: list[bool] = field(default_factory=lambda: [False])


def parse_section(check: Checker, value: Any, kinds: list[str]) -> EngineAxes:
    """Validate the ``[engine]`` table (``kinds``: the spec's workload kinds): lmc's axes,
    each policy's crossed with that policy only."""
    table = check.table(value, SECTION, ENGINE_KEYS)
    policy_table = check.table(table.get("policy", {"exact": {}}), "engine.policy",
                               set(POLICY_NAMES))
    if not policy_table:
        raise check.fail("engine.policy", f"name at least one policy; allowed: "
                         f"{', '.join(POLICY_NAMES)}")
    policies = []
    for name in POLICY_NAMES:  # a fixed order keeps expansion independent of the file's order
        if name in policy_table:
            policies.append(_policy(check, name, policy_table[name]))
    featured = [p.name for p in policies if p.name in FEATURE_POLICIES]
    if featured and "attn-bench" in kinds:
        raise check.fail(f"engine.policy.{featured[0]}",
                         f"{featured[0]} scores keys from token features, which attn-bench's "
                         "synthetic data has none of (lmc runs it in generate and ppl only): "
                         "put the attn-bench workload and this policy in separate specs")
    threads = None
    if "threads" in table:
        threads = check.axis(table["threads"], "engine.threads", "int", low=1,
                             high=LMC_LIMITS["threads"])
    wq = check.axis(table.get("wq", LMC_DEFAULTS["wq"]), "engine.wq", "str", choices=WQ_FORMATS)
    bf16_acts = check.axis(table.get("bf16_acts", False), "engine.bf16_acts", "bool")
    if True in bf16_acts and "bf16" not in wq:
        raise check.fail("engine.bf16_acts", "rounds the activations of bf16 weight products "
                         "(lmc --bf16-acts): add \"bf16\" to engine.wq")
    return EngineAxes(
        policies=policies,
        kv=check.axis(table.get("kv", LMC_DEFAULTS["kv"]), "engine.kv", "str",
                      choices=KV_FORMATS),
        wq=wq,
        threads=threads,
        prefill_attn=check.axis(table.get("prefill_attn", LMC_DEFAULTS["prefill_attn"]),
                                "engine.prefill_attn", "str", choices=PREFILL_ATTN),
        measure_selection=check.scalar(table.get("measure_selection", False),
                                       "engine.measure_selection", "bool"),
        trace_selection=check.scalar(table.get("trace_selection", False),
                                     "engine.trace_selection", "bool"),
        measure_keys=check.minimum(check.scalar(table["measure_keys"], "engine.measure_keys",
                                                "int"), "engine.measure_keys", 1)
        if "measure_keys" in table else None,
        measure_keys_keep=check.axis(table.get("measure_keys_keep", MEASURE_KEYS_KEEP),
                                     "engine.measure_keys_keep", "int", low=1, high=99),
        measure_keys_direct=check.minimum(check.scalar(
            table["measure_keys_direct"], "engine.measure_keys_direct", "int"),
            "engine.measure_keys_direct", 32) if "measure_keys_direct" in table else None,
        bf16_acts=bf16_acts,
    )


def _policy(check: Checker, name: str, axes: Any) -> PolicyAxes:
    key = f"engine.policy.{name}"
    switches = {s.name for s in SWITCHES if name in s.policies}
    if name == "exact":
        if not isinstance(axes, dict):
            raise check.fail(key, "must be a table")
        bad = sorted(set(axes) - switches)
        if bad:
            raise check.fail(f"{key}.{bad[0]}", "exact attention takes no policy axes but "
                             f"{', '.join(sorted(switches))} (k, block and probes apply to "
                             "the non-exact policies only)")
        return PolicyAxes(name, [None], [None], [None], _switches(check, axes, key, switches))
    own = {"kv_budget"} if name in EVICTING else set()
    axes = check.table(axes, key, set(POLICY_AXES) | switches | own
                       | ({"predictor"} if name == "gbm" else set()))
    values = {
        axis: check.axis(axes.get(axis, LMC_DEFAULTS[axis]), f"{key}.{axis}", "int", low=1,
                         high=LMC_LIMITS[axis])
        for axis in POLICY_AXES
    }
    kv_budget: list[int | None] = [None]
    if "kv_budget" in axes:
        kv_budget = list(check.axis(axes["kv_budget"], f"{key}.kv_budget", "int", low=1,
                                    high=LMC_LIMITS["kv_budget"]))
        small = [b for b in kv_budget for blk in values["block"] if b < blk]
        if small:
            raise check.fail(f"{key}.kv_budget", f"{small[0]} positions is less than one "
                             f"block ({max(values['block'])}); a budget keeps whole blocks")
    return PolicyAxes(name, values["k"], values["block"], values["probes"],
                      _switches(check, axes, key, switches), kv_budget,
                      _predictor(check, axes, key) if name == "gbm" else None)


def _predictor(check: Checker, axes: dict[str, Any], key: str) -> Predictor:
    """gbm's required tree file, named relative to the spec's folder, and its sha256."""
    if "predictor" not in axes:
        raise check.fail(f"{key}.predictor", "gbm needs its trees: a predictor file (lmc-gbm) "
                         "relative to the spec's folder, e.g. one `benchfarm predictor study` "
                         "wrote (out/reports/<study>/predictor-cascade.gbm)")
    path = Path(check.relative_file(axes["predictor"], f"{key}.predictor"))
    try:  # the capped, regular-file-only reader: a 2 GB file is refused, not read whole
        content = read_bytes(path)
    except OSError as exc:
        raise check.fail(f"{key}.predictor", f"cannot read {path}: {exc.strerror or exc}"
                         ) from None
    if not content.startswith(b"lmc-gbm "):
        raise check.fail(f"{key}.predictor", f"{path} is not an lmc-gbm predictor file (it "
                         "does not start with 'lmc-gbm'); `benchfarm predictor study` writes one")
    return Predictor(path, hashlib.sha256(content).hexdigest())


def _switches(check: Checker, axes: dict[str, Any], key: str,
              names: set[str]) -> dict[str, list[bool | None]]:
    """The switch axes a policy table sets, the engine's default value written as None."""
    found = {}
    for name in sorted(names & set(axes)):
        default = SWITCH_DEFAULTS[name]
        values = check.axis(axes[name], f"{key}.{name}", "bool")
        found[name] = [None if value == default else value for value in values]
    return found
