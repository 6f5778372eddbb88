"""A claim as the audit judges it: what was published, the runs that test it and what makes
the comparison fair. ``reports.audit.claims_file`` reads them from a claims file; the checks
(``reports.audit.checks_*``) and the verdicts read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ANY = "any"


@dataclass(frozen=True)
class Fairness:
    """What must hold for a measurement here to be comparable with the published one."""

    models: tuple[str, ...] = (ANY,)  # the model(s) the claim is about; "any": mechanism claims
    device_class: str = ANY
    context: int | None = None  # prompt length the claim was measured at, in tokens
    context_tolerance: float = 0.05  # relative
    allow_emulated: bool = True  # timing claims set False: emulated timings are not hardware's


@dataclass(frozen=True)
class Measure:
    a: dict[str, list[Any]] = field(default_factory=dict)  # selector of the runs measured
    b: dict[str, list[Any]] = field(default_factory=dict)  # the second config (ratios, identity)
    params: dict[str, Any] = field(default_factory=dict)  # computed metrics: their setting
    baseline: dict[str, list[Any]] | None = None  # recall claims: exact must recall first
    baseline_min_recall: float = 0.9
    field: str = "decode_ms_per_token"  # time_ratio: which timing
    field_b: str = ""  # time_ratio: b's field when it is another one (e.g. select_bytes)


@dataclass(frozen=True)
class Precondition:
    """A property of the model the claim's mechanism needs, measured like a claim: when our
    figure of it lies outside [at_least, at_most] the claim is graded "precondition absent"."""

    what: str  # the property, in words
    metric: str
    measure: Measure
    at_least: float | None = None
    at_most: float | None = None
    why: str = ""  # why the mechanism needs it (and where the threshold comes from)


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    statement: str
    metric: str
    expected: float | None
    tolerance: float | None  # absolute
    rel_tolerance: float | None  # relative to |expected|
    at_least: float | None  # one-sided claims ("at least halves") give bounds instead
    at_most: float | None
    unit: str
    experiment: str | None  # the first of ``experiments``
    measure: Measure
    fair: Fairness
    quantity: str  # `reported` claims: what was measured (that benchfarm cannot measure)
    note: str
    quote: str = ""  # the source's own sentence (or table row) the figures come from, verbatim
    kind: str = "direct"  # reports.audit.claims_file.KINDS
    setting: str = ""  # the article's setting of the figure (model, device, data)
    differs: str = ""  # analogue: what differs from the article's setting
    experiments: tuple[str, ...] = ()  # whose runs together are the evidence
    strength: str = ""  # reports.audit.grade.STRENGTHS; "" derives it from kind and metric
    article: str = ""  # the article's own figure for this claim, as the article gives it
    gloss: str = ""  # the quote in English
    mutant: str = ""  # the engine mutant of the rule this claim checks (tests/audit)
    precondition: Precondition | None = None

    def tolerance_text(self) -> str:
        if self.tolerance is not None:
            return f"± {self.tolerance:g}"
        if self.rel_tolerance is not None:
            return f"± {100 * self.rel_tolerance:g} %"
        return ""

    def expected_text(self) -> str:
        if self.expected is not None:
            return f"{self.expected:g} {self.tolerance_text()} {self.unit}".strip()
        bounds = [f">= {self.at_least:g}"] if self.at_least is not None else []
        bounds += [f"<= {self.at_most:g}"] if self.at_most is not None else []
        return " and ".join(bounds) + (f" {self.unit}" if bounds and self.unit else "")

    def bounds(self) -> tuple[float, float]:
        """The range of measured values that reproduce the claim."""
        if self.expected is not None:
            allowed = (self.tolerance if self.tolerance is not None
                       else (self.rel_tolerance or 0.0) * abs(self.expected))
            return self.expected - allowed, self.expected + allowed
        low = self.at_least if self.at_least is not None else float("-inf")
        return low, self.at_most if self.at_most is not None else float("inf")

    def within(self, measured: float) -> bool:
        low, high = self.bounds()
        return low - 1e-12 <= measured <= high + 1e-12
