"""lmc's attention vocabulary, as stored runs are written in it: the policies, the engine
switches and the defaults of the axes.

One list for the whole project. The harness checks specs against it and makes lmc's flags from
it (harness.engines.lmc); the report labels a config by what differs from its defaults
(reports.runs); ``lmc info`` prints the engine's own table (engine/policy.h), and
tests/plan/test_engines.py holds the two together. It lives beside the store's records because the
runs' columns (policy, k, block, probes, kv, wq, prefill_attn) and the switches in their config
are this vocabulary, and every package may read db.

To add a policy: a row of POLICIES (and of the engine's table), and its name in the recency
switch's policies if its selection keeps the last block (T_RECENCY in the engine's row): the
checklist in harness/engines/README.md. To add a switch: a row of SWITCHES (and of the
engine's), and the engine's flag does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

NAME = "lmc"  # the engine whose vocabulary this is (harness.engines.lmc)


@dataclass(frozen=True)
class Policy:
    name: str  # lmc --attn NAME
    evicts: bool  # --kv-budget can evict by its keep score (and --measure-keys rank by it)
    features: bool  # scores keys from token features: generate and ppl only, not attn-bench


POLICIES: tuple[Policy, ...] = (
    Policy("exact", evicts=False, features=False),
    Policy("sparse", evicts=True, features=False),
    Policy("window", evicts=True, features=False),
    Policy("h2o", evicts=True, features=False),
    Policy("quest", evicts=True, features=False),
    Policy("random", evicts=True, features=False),
    Policy("oracle", evicts=True, features=False),
    Policy("h2o-prev", evicts=True, features=True),
    Policy("gbm", evicts=True, features=True),
)
POLICY_NAMES = tuple(p.name for p in POLICIES)
EVICTING = tuple(p.name for p in POLICIES if p.evicts)
FEATURE_POLICIES = tuple(p.name for p in POLICIES if p.features)


@dataclass(frozen=True)
class Switch:
    """An engine switch, a spec axis of true/false under the policies that take it. A run's
    config holds it only when set away from the default, so runs at the defaults keep their
    keys; its flag is given exactly then."""

    name: str  # the spec key and the config key
    flag: str  # lmc's flag, which sets it away from the default
    default: bool
    policies: tuple[str, ...]  # the policies it applies to

    @property
    def label(self) -> str:
        """The report's name for it when set: the flag without its dashes."""
        return self.flag.removeprefix("--")


SWITCHES: tuple[Switch, ...] = (
    Switch("importance", "--no-importance", True, ("sparse",)),
    # the policies whose row in engine/policy.h has T_RECENCY
    Switch("recency", "--no-recency", True, ("sparse", "h2o", "quest", "random", "h2o-prev",
                                             "gbm")),
    Switch("probe_summary", "--probe-summary", False, ("sparse",)),
    Switch("ref_attn", "--ref-attn", False, ("exact",)),
    # layer 0 attends exactly under every policy: one first-layer treatment for all
    Switch("exact_first_layer", "--exact-first-layer", False,
           tuple(p.name for p in POLICIES if p.name != "exact")),
)
SWITCH_NAMES = tuple(s.name for s in SWITCHES)

def shows_k(policy: str, k: int | None, kv_budget: int | None) -> bool:
    """Whether a config's label names its k: not for exact attention (it has none), nor under
    eviction for good (``kv_budget``: the budget, not k, decides what is kept)."""
    return policy != "exact" and k is not None and kv_budget is None


# lmc's defaults of the other axes (what it runs without the flag)
DEFAULTS = {"k": 32, "block": 32, "probes": 8, "kv": "f32", "wq": "f32", "prefill_attn": "exact",
            "threads": 1}
# the policy-specific axes, with their defaults when a non-exact policy names none
POLICY_AXES = ("k", "block", "probes")
KV_FORMATS = ("f32", "q8")
WQ_FORMATS = ("f32", "q8", "bf16")  # bf16: BF16 weight files kept as stored
PREFILL_ATTN = ("exact", "sparse")
