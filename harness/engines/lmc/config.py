"""One lmc run's engine config (a point of the ``[engine]`` axes), and the crossing of the axes
into the configs of a workload kind.

A config's ``as_dict`` goes into run keys and the stored run: switches at their default (and the
axes added later, when unset) are left out, so a run keeps the key it had before they existed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from typing import Any

from db.lmc_axes import EVICTING, SWITCH_NAMES, shows_k
from harness.engines.lmc.section import MEASURE_KEYS_KEEP, EngineAxes

AXES = ("policy", "k", "block", "probes", "kv", "wq", "threads", "prefill_attn",
        "measure_selection")
# the axes stored as the runs' indexed columns (db.records.AXIS_COLUMNS): every one of them
COLUMNS = ("policy", "k", "block", "probes", "kv", "wq", "threads", "prefill_attn")
# of those, what a run's duration depends on besides its command and size
TIMING_COLUMNS = ("policy", "k")
# axes added after the first runs were stored: left out of a config when unset
LATER_AXES = ("trace_selection", "kv_budget", "predictor", "measure_keys", "measure_keys_keep",
              "measure_keys_direct", "bf16_acts")


@dataclass(frozen=True)
class EngineConfig:
    policy: str
    k: int | None
    block: int | None
    probes: int | None
    kv: str | None  # None where the command ignores it (attn-bench)
    wq: str | None
    threads: int
    prefill_attn: str | None
    measure_selection: bool
    # the engine switches set away from their defaults, in db.lmc_axes.SWITCHES's order
    switches: tuple[tuple[str, bool], ...] = ()
    trace_selection: bool | None = None  # --trace-selection (None: no trace)
    kv_budget: int | None = None  # --kv-budget: positions each head keeps (None: no eviction)
    predictor: str | None = None  # gbm: the sha256 of its tree file
    measure_keys: int | None = None  # --measure-keys: rank the keys of every N-th query
    # --measure-keys-keep: % of keys kept for lost_keep (None: lmc's default, 50)
    measure_keys_keep: int | None = None
    measure_keys_direct: int | None = None  # --measure-keys-direct D (None: off)
    bf16_acts: bool | None = None  # --bf16-acts, with wq bf16 (None: off)

    def as_dict(self) -> dict[str, Any]:
        """The config for run keys and records (see the module's docstring), in the stored
        order: the axes, the switches set, then the later axes that are set."""
        later = {name: getattr(self, name) for name in LATER_AXES
                 if getattr(self, name) is not None}
        return {name: getattr(self, name) for name in AXES} | dict(self.switches) | later

    def switch(self, name: str) -> bool | None:
        """A switch's value when set away from its default, else None."""
        return dict(self.switches).get(name)

    def columns(self) -> dict[str, Any]:
        """The run's axes as the store's columns (db.records.RunResult)."""
        return {name: getattr(self, name) for name in COLUMNS}

    def label(self) -> str:
        """The config as a run's progress line names it: the policy, then k or the budget."""
        words = [self.policy]
        if shows_k(self.policy, self.k, self.kv_budget):
            words.append(f"k={self.k}")
        if self.kv_budget is not None:
            words.append(f"kv-budget={self.kv_budget}")
        if self.measure_keys_keep is not None:
            words.append(f"ranked-keep={self.measure_keys_keep}%")
        return " ".join(words)


def configs(axes: EngineAxes, command: str, uses_model: bool,
            default_threads: int) -> list[EngineConfig]:
    """The configs of one workload kind: each policy's axes crossed with the shared ones.
    Without a model (attn-bench) there is no weight format, prefill or eviction, and
    bf16_acts applies to bf16 weights only; ppl measures no selection; the key ranking applies
    to ppl runs of the evicting policies."""
    measures = command in ("generate", "attn-bench")
    found: list[EngineConfig] = []
    for policy in axes.policies:
        names = sorted(policy.switches)
        for (k, block, probes, budget, kv, wq, acts, threads, prefill, keep,
             *switches) in itertools.product(
            policy.k, policy.block, policy.probes, policy.kv_budget, axes.kv, axes.wq,
            axes.bf16_acts, axes.threads or [default_threads], axes.prefill_attn,
            axes.measure_keys_keep, *(policy.switches[name] for name in names),
        ):
            ranks = command == "ppl" and policy.name in EVICTING and axes.measure_keys is not None
            config = EngineConfig(
                policy=policy.name, k=k, block=block, probes=probes,
                kv=kv,
                wq=wq if uses_model else None,
                threads=threads,
                prefill_attn=prefill if uses_model else None,
                measure_selection=axes.measure_selection and measures,
                switches=_set_switches(dict(zip(names, switches, strict=True))),
                trace_selection=True if axes.trace_selection and measures else None,
                kv_budget=budget if uses_model else None,
                predictor=policy.predictor.sha256 if policy.predictor else None,
                measure_keys=axes.measure_keys if ranks else None,
                measure_keys_keep=keep if ranks and keep != MEASURE_KEYS_KEEP else None,
                measure_keys_direct=axes.measure_keys_direct if ranks else None,
                bf16_acts=True if acts and uses_model and wq == "bf16" else None,
            )
            if config not in found:  # axes a command ignores would only repeat a config
                found.append(config)
    return found


def _set_switches(values: dict[str, bool | None]) -> tuple[tuple[str, bool], ...]:
    """The switches set away from their defaults (None), in the vocabulary's order."""
    return tuple((name, value) for name in SWITCH_NAMES
                 if (value := values.get(name)) is not None)


def count(axes: EngineAxes, uses_model: bool) -> int:
    """len(configs(...)) without building them: axis values are distinct, and only the axes a
    command ignores collapse (and bf16_acts but with wq bf16)."""
    weights = sum(len(axes.bf16_acts) if wq == "bf16" else 1 for wq in axes.wq)
    shared = (len(axes.kv) * len(axes.threads or [0])
              * (weights * len(axes.prefill_attn) if uses_model else 1))
    return shared * sum(len(p.k) * len(p.block) * len(p.probes)
                        * (len(p.kv_budget) if uses_model else 1)
                        * math.prod(len(values) for values in p.switches.values())
                        for p in axes.policies)


assert set(SWITCH_NAMES).isdisjoint(EngineConfig.__dataclass_fields__)
assert [f.name for f in fields(EngineConfig)] == [*AXES, "switches", *LATER_AXES]
