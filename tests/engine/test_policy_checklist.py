"""The checklist "Add an attention policy (lmc)" (harness/engines/README.md) is true.

Its worked example, `window2` (window's rule under a new name, after `window`), is made here
with the code edits the checklist names and no others: one row of LMC_POLICY_TABLE in a copy of
engine/policy.h, one case label in the copy's engine/select.c and one row of POLICIES in a copy
of db/lmc_axes.py. The copied engine must build and run `--attn window2` bit for bit as window
(per-query selection and --kv-budget eviction, whose sink rule comes from the row's keep score,
not from evict.c), and `lmc info` must agree with the copied list as tests/plan/test_engines.py
holds the real ones. The counts the checklist and docs/architecture.md state are held against
the checklist's own numbered list."""

from __future__ import annotations

import filecmp
import importlib.util
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fixtures_engine import lmc_json, run_lmc, write_tokens

from harness import ENGINE_DIR, REPO_ROOT
from harness.engines.lmc.build import build_engine

NEW = "window2"
CHECKLIST = REPO_ROOT / "harness" / "engines" / "README.md"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
HEADING = re.compile(r"\*\*Add an attention policy \(lmc\)\*\* "
                     r"\((\d+) files; (\d+) with a new kind of keep score\)")
# the files the worked example edits: the checklist's items 1 to 3
EDITED = ["engine/policy.h", "engine/select.c", "db/lmc_axes.py"]


def edit_once(path: Path, pattern: str, add, after: bool) -> None:
    """Insert add(match, line) after (or before) the one line of path matching pattern (fails
    unless exactly one does)."""
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert len(hits) == 1, f"{path.name}: {len(hits)} lines match {pattern!r}, expected one"
    i = hits[0]
    lines.insert(i + after, add(re.search(pattern, lines[i]), lines[i]))
    path.write_text("".join(lines))


def checklist_items() -> list[str]:
    """The numbered items under the checklist's heading, joined across their wrapped lines."""
    lines = CHECKLIST.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if HEADING.search(line))
    items: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("**"):
            break
        if re.match(r"\d+\. ", line):
            items.append(line)
        elif items and line.startswith("   "):
            items[-1] += " " + line.strip()
        elif items and not line.strip():
            break
    return items


def test_the_stated_counts_are_the_checklist_items():
    heading = HEADING.search(CHECKLIST.read_text())
    assert heading, "the checklist's heading no longer states its counts"
    always, most = int(heading[1]), int(heading[2])
    items = checklist_items()
    assert [int(item.split(".")[0]) for item in items] == list(range(1, most + 1))
    # the items past `always` are the conditional ones, and say so
    assert all(item.split(". ", 1)[1].startswith("Only") for item in items[always:])
    assert not any(item.split(". ", 1)[1].startswith("Only") for item in items[:always])
    # one file each, which exists
    for item in items:
        path = re.search(r"`([\w/.]+\.(?:h|c|py|md))`", item)
        assert path and (REPO_ROOT / path[1]).is_file(), item
    # the worked example edits exactly items 1 to 3
    assert [re.search(r"`([\w/.]+)`", item)[1] for item in items[:3]] == EDITED
    # docs/architecture.md states the same counts
    arch = " ".join(ARCHITECTURE.read_text().split())
    counts = f"({always} files; {most} with a new kind of keep score)"
    assert f"**An attention policy of lmc** {counts}" in arch


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Iterator[tuple[Path, object]]:
    """(the window2 engine's binary, the copied db.lmc_axes module with window2's row)."""
    root = tmp_path_factory.mktemp("policy_checklist")
    engine = root / "engine"
    shutil.copytree(ENGINE_DIR, engine)
    # 1. engine/policy.h: window's row again, under the new names
    edit_once(engine / "policy.h", r'^\s*X\(a, WINDOW, "window",',
              lambda m, line: line.replace("WINDOW", "WINDOW2").replace('"window"', f'"{NEW}"'),
              after=True)
    # 2. engine/select.c: window's selection, as a case label beside window's
    edit_once(engine / "select.c", r"^(\s*)case POL_WINDOW:",
              lambda m, line: f"{m[1]}case POL_WINDOW2:\n", after=False)
    # nothing else in the engine changed
    cmp = filecmp.dircmp(ENGINE_DIR, engine)
    assert sorted(cmp.diff_files) == ["policy.h", "select.c"] and not cmp.left_only \
        and not cmp.right_only
    # 3. db/lmc_axes.py: window's row again, under the new name
    axes_path = root / "lmc_axes.py"
    shutil.copy(REPO_ROOT / "db" / "lmc_axes.py", axes_path)
    edit_once(axes_path, r'^\s*Policy\("window",',
              lambda m, line: line.replace('"window"', f'"{NEW}"'), after=True)
    spec = importlib.util.spec_from_file_location("scratch_lmc_axes", axes_path)
    axes = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = axes  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(axes)
    finally:
        del sys.modules[spec.name]
    record = build_engine(engine_dir=engine, build_root=root / "build")
    yield Path(record.binary), axes
    shutil.rmtree(root / "build", ignore_errors=True)


def test_lmc_info_lists_the_new_policy_as_the_copied_list(scratch):
    binary, axes = scratch
    info = lmc_json(binary, "info")
    policies = info["policies"]
    assert policies[policies.index("window") + 1] == NEW
    # as tests/plan/test_engines.py holds the real tables together
    assert policies == list(axes.POLICY_NAMES)
    assert set(info["evicting"]) == set(axes.EVICTING) and NEW in info["evicting"]
    assert set(info["feature_policies"]) == set(axes.FEATURE_POLICIES)
    assert [(s["name"], s["flag"], s["default"], set(s["policies"])) for s in info["switches"]] \
        == [(s.name, s.flag, s.default, set(s.policies)) for s in axes.SWITCHES]
    switches = {s["name"]: set(s["policies"]) for s in info["switches"]}
    assert NEW in switches["exact_first_layer"] and NEW not in switches["recency"]


def test_the_option_checks_name_the_new_policy(scratch):
    binary, _ = scratch
    bench = ["attn-bench", "--ctx", 64, "--heads", 2, "--kv-heads", 1, "--head-dim", 8, "--runs", 1]
    bad = run_lmc(binary, *bench, "--attn", "nope")
    assert bad.returncode == 2 and "(allowed: exact, sparse, window, window2, h2o," in bad.stderr
    refused = run_lmc(binary, *bench, "--attn", NEW, "--probe-summary")
    assert refused.returncode == 2
    assert f"--probe-summary applies to --attn sparse only (got --attn {NEW})" in refused.stderr
    taken = run_lmc(binary, *bench, "--attn", NEW, "--exact-first-layer")
    assert taken.returncode == 0, taken.stderr


def test_attn_bench_selects_as_window(scratch, tmp_path):
    binary, _ = scratch
    docs = {}
    for policy in ("window", NEW):
        trace = tmp_path / f"{policy}.trace"
        docs[policy] = lmc_json(binary, "attn-bench", "--ctx", 300, "--heads", 4, "--kv-heads", 2,
                                "--head-dim", 16, "--k", 3, "--block", 16, "--runs", 1,
                                "--measure-selection", "--trace-selection", trace,
                                "--attn", policy)
        docs[policy]["trace"] = trace.read_text()
    assert docs[NEW]["policy"] == docs[NEW]["config"]["attn"] == NEW
    assert docs[NEW]["selection"] == docs["window"]["selection"]
    assert docs[NEW]["selection"]["oracle_recall"] < 1  # k = 3 of 19 blocks: a real choice
    assert docs[NEW]["trace"] == docs["window"]["trace"] and docs[NEW]["trace"].count("\n") > 4


# the prompt is attended by the policy too (--prefill-attn sparse): its logits are dumped
@pytest.mark.parametrize("extra", [("--k", "3"), ("--kv-budget", "24")], ids=["select", "evict"])
def test_generate_runs_the_new_policy_as_window(scratch, lmc, needle_model, tmp_path, extra):
    binary, _ = scratch
    prompt = write_tokens(tmp_path / "p.txt", [(i * 37 + 11) % 1000 for i in range(70)])
    runs = {}
    for name, exe, policy in (("new", binary, NEW), ("window", binary, "window"),
                              ("h2o", binary, "h2o"), ("real h2o", lmc, "h2o"),
                              ("exact", lmc, "exact")):
        dump = tmp_path / f"{name.replace(' ', '_')}.bin"
        doc = lmc_json(exe, "generate", "--model", needle_model, "--prompt", prompt, "--max-new", 8,
                       "--block", 8, "--dump-logits", dump, "--attn", policy,
                       *(("--prefill-attn", "sparse", *extra) if policy != "exact" else ()))
        runs[name] = (doc, np.fromfile(dump, dtype=np.float32))
    (new, new_logits), (window, window_logits) = runs["new"], runs["window"]
    assert new["config"]["attn"] == NEW and len(new["tokens"]) == 8
    assert new["tokens"] == window["tokens"] and new_logits.tobytes() == window_logits.tobytes()
    # the row inserted before h2o's moved h2o's id, nothing else: it runs as the real engine's
    assert runs["h2o"][0]["tokens"] == runs["real h2o"][0]["tokens"]
    assert runs["h2o"][1].tobytes() == runs["real h2o"][1].tobytes()
    assert not np.array_equal(runs["h2o"][1], window_logits)
    # and window2 is not exact attention in disguise: it drops blocks
    assert not np.array_equal(new_logits, runs["exact"][1])
    if "--kv-budget" in extra:
        assert new["kv_memory"]["paged"]
        assert new["kv_memory"]["peak_live_bytes"] == window["kv_memory"]["peak_live_bytes"]
