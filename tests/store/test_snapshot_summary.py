"""A snapshot's summary (db.rows.snapshot_summary) stands in for its fingerprint wherever
reports read every run: each condition devices.conditions flags, with the judgement stored in
the fingerprint or made when it is read, and the CPU, must come out of the summary as they
come out of the whole document."""

from __future__ import annotations

from typing import Any

import pytest
from fixtures_reports import healthy_fingerprint

from db.rows import snapshot_summary
from devices.conditions import ORDER, snapshot_flags, stored_or_computed
from reports.cpu import cpu_label


def conditions() -> dict[str, dict[str, Any]]:
    """A fingerprint for every flag devices.conditions raises, and a healthy one."""
    base = healthy_fingerprint()
    core = base["cores"][0]
    dmc = {"device": "dmc", "governor": "dmc_ondemand", "cur_hz": 528000000,
           "min_hz": 528000000, "max_hz": 2112000000,
           "available_hz": [528000000, 1068000000, 1560000000, 2112000000]}
    return {
        "healthy": base,
        "emulated": {**base, "emulated": True},
        "non-performance-governor": healthy_fingerprint(governor="schedutil"),
        "throttling (a capped policy)": {**base, "cores": [{**core,
                                                            "policy_max_khz": 1800000}]},
        "throttling (a hot zone)": healthy_fingerprint(temp_c=90.0),
        "memory-clock-low": {**base, "devfreq": [dmc]},
        "loaded": {**base, "loadavg": [3.5, 2.0, 1.0]},
        "low-memory": {**base, "mem_total_kb": 4000000, "mem_available_kb": 100000},
        "an old schema's CPU": {"cpu": "Old Xeon", "loadavg": [0.2, 0.1, 0.1]},
    }


@pytest.mark.parametrize("name", list(conditions()))
@pytest.mark.parametrize("judged", [False, True], ids=["judged when read", "judged when taken"])
def test_a_summary_is_judged_as_its_fingerprint(name: str, judged: bool) -> None:
    fingerprint = conditions()[name]
    for phase in ("before", "after"):
        document = dict(fingerprint, flags=snapshot_flags(fingerprint, phase)) if judged \
            else fingerprint
        summary = snapshot_summary(document)
        assert stored_or_computed(summary, phase) == stored_or_computed(document, phase)
        assert cpu_label(summary) == cpu_label(document)
        assert summary.get("loadavg") == document.get("loadavg")
    if name.split()[0] in ORDER:  # the fixture raises the flag it is named after
        assert name.split()[0] in stored_or_computed(fingerprint, "before")


def test_a_judged_fingerprint_keeps_only_what_reports_read() -> None:
    """A fingerprint that carries its flags leaves its cores, thermal zones and memory figures
    out of its summary: the summary stays a few dozen bytes however large the board."""
    fingerprint = healthy_fingerprint()
    fingerprint["flags"] = snapshot_flags(fingerprint, "before")
    assert snapshot_summary(fingerprint) == {"flags": [], "cpu_model": "Synthetic CPU",
                                             "loadavg": [0.1, 0.1, 0.1]}
    assert snapshot_summary(None) == {} and snapshot_summary(["not", "a", "dict"]) == {}
