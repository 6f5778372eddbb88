"""What a report and `status` open with: a warning when exact attention fails its own workload,
the comparison an experiment was run for, the unit of replication; no CV for one run."""

from __future__ import annotations

import re
from pathlib import Path

from fixtures_reports import SyntheticExperiment

from db import Store
from harness.commands.status import render_summary
from reports.aggregate import timing_table
from reports.render import render_report, timing_display
from reports.runs import load_experiment


def _headings(markdown: str) -> list[str]:
    return re.findall(r"^## (.+)$", markdown, flags=re.MULTILINE)


def test_a_failed_baseline_opens_the_report_and_status(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/broken.db")
    exp = SyntheticExperiment(store)
    for repeat in range(2):  # the answer cut off: no config recalls, exact included
        exp.run(ctx=256, repeat=repeat, recall=0.0)
        exp.run(ctx=256, repeat=repeat, policy="sparse", k=8, recall=0.0)
        exp.run(ctx=512, repeat=repeat, recall=1.0)  # a context where exact still works
        exp.run(kind="ppl", ctx=64, repeat=repeat, ppl=5.0e4, recall=None)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    first = _headings(markdown)[0]
    assert first == "Warning: the baseline failed"
    warning = markdown.split("## Warning: the baseline failed\n", 1)[1].split("\n## ")[0]
    assert "local needle ctx=256: recall 0.00" in warning
    assert "local ppl length=64: perplexity 5e+04" in warning
    assert "ctx=512" not in warning  # exact recalled there
    status = render_summary(store.experiment_summary("synthetic"))
    assert status.startswith("WARNING: exact attention, the baseline, fails its own workload")
    assert "perplexity 5e+04" in status.splitlines()[0]
    store.close()


def test_a_sound_baseline_gives_no_warning(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/sound.db")
    exp = SyntheticExperiment(store)
    exp.run(ctx=256, recall=1.0)
    exp.run(ctx=256, policy="sparse", k=1, recall=0.0)  # a sparse config may fail: that is news
    exp.run(kind="ppl", ctx=64, ppl=12.0, recall=None)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    assert "Warning" not in _headings(markdown) and "WARNING" not in markdown
    assert "WARNING" not in render_summary(store.experiment_summary("synthetic"))
    store.close()


def test_a_device_comparison_leads_and_the_unit_of_replication_is_named(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/devices.db")
    exp = SyntheticExperiment(store)
    exp.add_device("arm", arch="aarch64", cls="rk3588")
    for repeat in range(5):
        exp.run(ctx=256, repeat=repeat, decode_ms=10.0 + repeat / 100)
        exp.run(device="arm", ctx=256, repeat=repeat, decode_ms=15.0 + repeat / 100)
    markdown = (render_report(store, "synthetic", tmp_path / "out").parent
                / "report.md").read_text()
    headings = _headings(markdown)
    assert headings[0] == "Devices compared"
    assert headings.index("Devices compared") < headings.index("Manifest")
    assert "1 faster" in markdown.split("## Manifest")[0]  # local against arm, 5 a side: decided
    assert "Unit of replication: the run" in markdown
    store.close()


def test_one_run_shows_no_cv_and_more_runs_do(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/cv.db")
    exp = SyntheticExperiment(store)
    exp.run(ctx=256, decode_ms=10.0)
    exp.run(ctx=512, repeat=0, decode_ms=10.0)
    exp.run(ctx=512, repeat=1, decode_ms=12.0)
    shown = timing_display(timing_table(load_experiment(store, "synthetic").runs))
    by_ctx = shown.set_index("ctx")["decode ms/token CV"]
    assert by_ctx[256] == ""
    assert by_ctx[512] == "12.9 %"
    store.close()
