"""The audit of published claims: claims files, checks per metric family, verdicts, outputs."""

from reports.audit.claim import Claim
from reports.audit.claims_file import ClaimsFile, load_claims, parse_claims
from reports.audit.report import (
    audit_markdown,
    audit_section,
    terminal_table,
    verdict_table,
    write_audit,
)
from reports.audit.verdict import (
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    DeviceInfo,
    Environment,
    Verdict,
    run_audit,
)

__all__ = [
    "INCONCLUSIVE",
    "NOT_COMPARABLE", "NOT_REPRODUCED", "REPRODUCED", "Claim", "ClaimsFile", "DeviceInfo",
    "Environment", "Verdict", "audit_markdown", "audit_section", "load_claims", "parse_claims",
    "run_audit", "terminal_table", "verdict_table", "write_audit",
]
