"""A verdict's grade: what its outcome shows, by the strength of the claim's check.

The outcome (reproduced, not reproduced, inconclusive, not comparable) says whether our figure
met the claim's range; the grade says what meeting it is worth:

- ``figure``: the article's own number matched within the claim's tolerance -> ``reproduced``
  / ``not reproduced``. Only these count in "figures reproduced: X of Y checkable";
- ``direction``: only the sign or order of the article's figures is tested -> ``direction
  holds`` / ``direction fails`` (a relation cut to a sign is a sign check, counted as one);
- ``arithmetic``: the article's own figures recomputed -> ``consistent`` / ``inconsistent``;
- ``rule``: a rule checked in the engine's code or traces -> ``verified`` only when a mutant of
  that rule (``claim.mutant``, tests/audit/test_mutants.py) is shown to flip the verdict, else
  ``holds, check unproven``; a failing rule is ``refuted``;
- ``sanity``: a check of the setup, never counted -> ``sanity holds`` / ``sanity fails``.

Beside them: ``precondition absent`` (the model lacks what the mechanism needs; the claim says
what and our figure of it), ``inconclusive`` and ``not comparable``.
"""

from __future__ import annotations

from reports.audit.claim import Claim

STRENGTHS = ("figure", "direction", "arithmetic", "rule", "sanity")
# (holds, fails) per strength
OUTCOME_GRADES = {
    "figure": ("reproduced", "not reproduced"),
    "direction": ("direction holds", "direction fails"),
    "arithmetic": ("consistent", "inconsistent"),
    "rule": ("verified", "refuted"),
    "sanity": ("sanity holds", "sanity fails"),
}
UNPROVEN = "holds, check unproven"
PRECONDITION_ABSENT = "precondition absent"
INCONCLUSIVE, NOT_COMPARABLE = "inconclusive", "not comparable"
# every grade, in the order the outputs list them: checkable ones first, sanity and the ones
# that could not be judged last
GRADES = ("reproduced", "not reproduced", INCONCLUSIVE, "direction holds", "direction fails",
          "consistent", "inconsistent", "verified", UNPROVEN, "refuted", PRECONDITION_ABSENT,
          "sanity holds", "sanity fails", NOT_COMPARABLE)


def strength_of(claim: Claim) -> str:
    """The claim's own ``strength``, else what its kind and metric say: sanity and verified
    kinds, arithmetic on quoted figures (``quotient``), relations (bounds without the article's
    figure) as directions, anything else as a figure."""
    if claim.strength:
        return claim.strength
    if claim.kind == "sanity":
        return "sanity"
    if claim.metric == "quotient":
        return "arithmetic"
    if claim.kind == "verified":
        return "rule"
    if claim.kind == "relation":
        return "direction"
    return "figure"


def grade(claim: Claim, outcome: str, precondition_absent: bool = False) -> str:
    """The grade of a claim's outcome (the module says how)."""
    if precondition_absent:
        return PRECONDITION_ABSENT
    if outcome in (INCONCLUSIVE, NOT_COMPARABLE):
        return outcome
    strength = strength_of(claim)
    holds, fails = OUTCOME_GRADES[strength]
    if outcome != "reproduced":
        return fails
    if strength == "rule" and not claim.mutant:
        return UNPROVEN
    return holds


def figures_line(claims_and_grades: list[tuple[Claim, str]]) -> str:
    """"figures reproduced: X of Y checkable": Y counts the figure claims that could be judged
    here (reproduced, not reproduced or inconclusive)."""
    figures = [g for c, g in claims_and_grades if strength_of(c) == "figure"
               and g in ("reproduced", "not reproduced", INCONCLUSIVE)]
    return (f"figures reproduced: {figures.count('reproduced')} of {len(figures)} checkable")
