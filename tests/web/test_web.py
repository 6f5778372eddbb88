"""`benchfarm web`: a real server on loopback over a real SQLite store, its JSON API, its token
gate, and the page in a real headless Chromium (Selenium, Debian's chromium-driver) while a
`benchfarm run` in another process works through a matrix on the local board."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fixtures_cluster import free_port
from fixtures_ray import needle_spec, slow_local_board, start_cli
from fixtures_reports import SyntheticExperiment, build_record
from fixtures_web import LOOPBACK, serving
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from db.leases import utcnow
from db.store import Store
from harness import REPO_ROOT
from harness.cli import main
from reports.audit import load_claims

HOSTILE = "<script>alert(1)</script>"
SHARED_TOKEN = "s3cret-token-of-the-lab"  # a single operator's (16 characters or more)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get_json(url: str) -> object:
    status, body = get(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """A headless Chromium whose profile and temporary folders (its singleton socket's
    ``org.chromium.Chromium.*``) are in a folder of the test session's, removed after."""
    scratch = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000", f"--user-data-dir={scratch / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service("/usr/bin/chromedriver", env={**os.environ, "TMPDIR": str(scratch)})
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def browser(chromium: webdriver.Chrome) -> webdriver.Chrome:
    """The module's Chromium on a blank page, with the last test's console messages dropped
    (its page went on polling a server that has stopped)."""
    chromium.get("about:blank")
    chromium.get_log("browser")
    return chromium


def text_of(driver: webdriver.Chrome, selector: str) -> str | None:
    """The text of the first element matching ``selector``, read in one step (the live script
    replaces rows, so an element found first and read later may be gone)."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null",
        selector)


def console_errors(driver: webdriver.Chrome) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def farm_store(url: str) -> tuple[Store, int]:
    """Two boards, runs on both (one failed), a running job with its matrix, a lease; x86-1 in
    maintenance after a good health check, arm-1 reserved and bad after a failed one."""
    store = Store.open(url)
    exp = SyntheticExperiment(store, name="alpha")
    exp.add_device("x86-1")
    exp.add_device("arm-1", arch="aarch64", cls="rk3588", emulated=True)
    job = store.jobs.add("alpha", "alpha.toml", exp.spec_text, owner="ana", priority=3,
                         holder="host:1:abc")
    store.jobs.set_totals(job, {"x86-1": 3, "arm-1": 2})
    exp.run(device="x86-1", repeat=0, job_id=job)
    exp.run(device="x86-1", repeat=1, job_id=job)
    exp.run(device="arm-1", status="failed", job_id=job)
    store.leases.acquire("arm-1", "host:1:abc", 600, experiment="alpha", run_key="alpha-9")
    store.boards.record_health("x86-1", True, [{"name": "ssh", "ok": True, "detail": "up"}],
                               "ana (devices check)")
    store.boards.set_state("x86-1", "maintenance", "fan swap", "ana")
    store.boards.record_health("arm-1", True, [{"name": "temp", "ok": True, "detail": "45 C"}],
                               "lab")
    store.boards.record_health("arm-1", False, [{"name": "temp", "ok": False,
                                                 "detail": "91 C"}], "lab")
    store.boards.reserve("arm-1", "bo", utcnow() + timedelta(hours=2), "demo day")
    return store, job


def test_the_json_api_returns_what_the_store_holds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/farm.db"
    store, job = farm_store(url)
    store.boards.set_state("spare-1", "retired", None, "ana")  # no run on it: no device row
    # a step `track` put down to the board: an event that leaves its state as it is
    store.boards.note("x86-1", "a step coincides with load on the board", "benchfarm track")
    with store, serving(url) as base:
        boards = {b["name"]: b for b in get_json(f"{base}/api/boards")}
        _, page = get(f"{base}/")
        jobs = get_json(f"{base}/api/jobs")
        one = get_json(f"{base}/api/jobs/{job}")
        missing, _ = get(f"{base}/api/jobs/999")
        experiment = get_json(f"{base}/api/experiments/alpha")
        summary = store.experiment_summary("alpha")
    arm, x86, spare = boards["arm-1"], boards["x86-1"], boards["spare-1"]
    assert (arm["cls"], arm["arch"], arm["emulated"], arm["activity"]) == (
        "rk3588", "aarch64", True, "running")
    assert (arm["holder"], arm["experiment"], arm["run_key"]) == ("host:1:abc", "alpha", "alpha-9")
    assert [f["error"] for f in arm["failures"]] == ["lmc: error: synthetic failure"]
    assert (arm["state"], arm["reason"], arm["changed_by"]) == (
        "bad", "health check failed: temp: 91 C", "lab")
    assert [(h["ok"], h["summary"]) for h in arm["health"]] == [
        (False, "FAILED temp: 91 C"), (True, "ok")]
    assert (arm["reservation"]["owner"], arm["reservation"]["reason"]) == ("bo", "demo day")
    ends = datetime.fromisoformat(arm["reservation"]["ends"].removesuffix("Z"))
    assert timedelta(hours=1) < ends - utcnow() <= timedelta(hours=2)
    assert (x86["activity"], x86["last_status"], x86["failures"], x86["emulated"]) == (
        "idle", "ok", [], False)
    assert (x86["state"], x86["reason"], x86["changed_by"], x86["reservation"]) == (
        "maintenance", "fan swap", "ana", None)
    assert x86["since"] is not None and spare["since"] is not None and arm["since"] is not None
    assert [(h["ok"], h["checked_by"]) for h in x86["health"]] == [(True, "ana (devices check)")]
    assert [(e["state"], e["changed_by"], e["reason"]) for e in x86["events"]] == [
        ("maintenance", "benchfarm track", "a step coincides with load on the board"),
        ("maintenance", "ana", "fan swap")]
    assert [e["state"] for e in spare["events"]] == ["retired"]
    assert (spare["state"], spare["cls"], spare["emulated"], spare["health"]) == (
        "retired", None, None, [])
    x86_row = page[page.index('<tr data-board="x86-1">'):].split("</tr>")[0]
    arm_row = page[page.index('<tr data-board="arm-1">'):].split("</tr>")[0]
    assert all(text in x86_row for text in ("maintenance", "fan swap", "by ana", "idle",
                                            "by benchfarm track: a step coincides with load"))
    assert all(text in arm_row for text in ("bad", "FAILED temp: 91 C", "bo until", "demo day"))
    assert [j["id"] for j in jobs] == [job]
    clock = ("elapsed_s", "remaining_s")
    assert {k: v for k, v in one.items() if k not in clock} == {
        k: v for k, v in jobs[0].items() if k not in clock}
    assert (one["owner"], one["priority"], one["state"], one["kind"]) == (
        "ana", 3, "running", "run")
    placements = {p["placement"]: p for p in one["placements"]}
    assert placements["x86-1"] == {"placement": "x86-1", "total": 3, "done": 2, "failed": 0,
                                   "running": 0, "pending": 1}
    assert placements["arm-1"] == {"placement": "arm-1", "total": 2, "done": 0, "failed": 1,
                                   "running": 1, "pending": 0}
    assert (one["total"], one["done"], one["failed"], one["running"], one["pending"]) == (
        5, 2, 1, 1, 1)
    assert one["elapsed_s"] >= 0 and one["remaining_s"] is None  # no run ended since its start
    assert missing == 404
    assert experiment["counts"] == summary.counts and experiment["job"]["id"] == job
    assert (experiment["revisions"], experiment["steps"]) == ([], [])  # one engine revision
    assert [(g["device"], g["runs"]) for g in experiment["groups"]] == [("x86-1", 2)]


def test_an_experiment_of_two_revisions_shows_its_timelines_and_steps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/history.db"
    store = Store.open(url)
    exp = SyntheticExperiment(store)
    revisions = ["1" * 40, "2" * 40]  # not commits of this checkout: kept in their given order

    def store_revision(i: int) -> None:
        exp.add_build(revisions[i], build_record(source_hash=f"{i:064x}", revision=revisions[i],
                                                 binary_sha256=f"{i + 10:064x}"))
        for repeat in range(3):
            exp.run(repeat=repeat, build=revisions[i],
                    decode_ms=(10.0, 30.0)[i] * (1 + 0.01 * repeat))

    store_revision(0)
    with store, serving(url) as base:
        one = get_json(f"{base}/api/experiments/synthetic")
        store_revision(1)  # while the dashboard runs: its next read has the second revision
        found = get_json(f"{base}/api/experiments/synthetic")
        status, html = get(f"{base}/experiments/synthetic")
    assert (one["revisions"], one["steps"]) == ([], [])
    assert found["revisions"] == revisions
    assert [(s["revision"], s["metric"], s["device"]) for s in found["steps"]] == [
        (revisions[1], "decode_ms_per_token", "local")]
    assert 2.9 < found["steps"][0]["ratio"] < 3.1
    history = html[html.index('<section id="history">'):].split("</section>")[0]
    assert status == 200 and html.count('<section id="history">') == 1
    assert "<svg" in history and history.count('class="mark"') == 1
    assert revisions[1] in history  # the steps' table names the commit


def test_the_audit_page_judges_a_claims_file_on_the_stored_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    farm_store(url)[0].close()
    claims = "seed_000_sparse_topk.toml"
    with serving(url) as base:
        verdicts = get_json(f"{base}/api/audit/{claims}")
        status, html = get(f"{base}/audit/{claims}")
        missing, _ = get(f"{base}/audit/..%2Fpyproject.toml")
    expected = [c.id for c in load_claims(REPO_ROOT / "claims" / claims).claims]
    assert [v["claim"] for v in verdicts] == expected
    assert status == 200 and 'id="table-audit"' in html and all(c in html for c in expected)
    assert missing == 404
    # the page leads with its counts per verdict (a claim's grade where the audit gives one)
    counts = html[html.index('<table id="verdict-counts">'):].split("</table>")[0]
    assert html.index('id="verdict-counts"') < html.index('id="table-audit"')
    per_verdict: dict[str, int] = {}
    for verdict in verdicts:
        key = verdict.get("grade") or verdict["verdict"]
        per_verdict[key] = per_verdict.get(key, 0) + 1
    for key, n in per_verdict.items():
        assert f'<tr data-verdict="{key}"><td class="text">{key}</td><td>{n}</td></tr>' in counts
    assert f"<td>{len(verdicts)}</td>" in counts.split("all")[-1]


def test_hostile_names_render_as_text(tmp_path: Path, browser: webdriver.Chrome) -> None:
    url = f"sqlite:///{tmp_path}/hostile.db"
    store = Store.open(url)
    exp = SyntheticExperiment(store, name=HOSTILE)
    exp.add_device(HOSTILE, cls=HOSTILE)
    exp.run(device=HOSTILE)
    exp.run(device=HOSTILE, status="failed")
    job = store.jobs.add(HOSTILE, "x.toml", exp.spec_text, owner=HOSTILE, holder=HOSTILE)
    store.jobs.set_totals(job, {HOSTILE: 4})
    store.leases.acquire(HOSTILE, HOSTILE, 600, experiment=HOSTILE, run_key=HOSTILE)
    store.boards.set_state(HOSTILE, "maintenance", HOSTILE, HOSTILE)
    store.boards.record_health(HOSTILE, False, [{"name": HOSTILE, "ok": False,
                                                 "detail": HOSTILE}], HOSTILE)
    store.boards.reserve(HOSTILE, HOSTILE, utcnow() + timedelta(hours=1), HOSTILE)
    with store, serving(url) as base:
        status, html = get(f"{base}/")
        assert status == 200 and HOSTILE not in html and "&lt;script&gt;" in html
        for path in ("/", f"/experiments/{urllib.request.quote(HOSTILE, safe='')}"):
            browser.get(base + path)
            browser.execute_script("window.__loaded = true")
            # the live script's first refresh replaced the server's rows from the JSON API
            WebDriverWait(browser, 60).until(lambda d: d.find_element(
                By.ID, "live").text.startswith("updated"))
            with pytest.raises(NoAlertPresentException):
                browser.switch_to.alert.text  # noqa: B018 - raises when there is no dialog
            assert browser.execute_script("return window.__loaded") is True
            scripts = browser.find_elements(By.TAG_NAME, "script")
            assert [s.get_attribute("src") for s in scripts] == [f"{base}/static/live.js"]
            assert HOSTILE in browser.find_element(By.TAG_NAME, "body").text
            assert console_errors(browser) == []
            if path == "/":  # the stored reason and health check, as the live script wrote them
                assert text_of(browser, "#boards td.reason") == HOSTILE
                assert HOSTILE in text_of(browser, "#boards td.health .health-failed")
                assert text_of(browser, "#boards td.events div").endswith(
                    f"by {HOSTILE}: {HOSTILE}")
            # the live rows span every column
            assert browser.execute_script(
                "const width = (row) => [...row.cells].reduce((n, c) => n + c.colSpan, 0);"
                "return [...document.querySelectorAll('table')].filter(t => t.tHead && "
                "[...t.tBodies[0].rows].some(r => width(r) !== width(t.tHead.rows[0])))"
                ".map(t => t.id)") == []
        cells = browser.execute_script(
            "return [...document.querySelectorAll('#counts td')].map(td => td.textContent)")
        assert HOSTILE in cells


def test_a_token_guards_every_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/guarded.db"
    farm_store(url)[0].close()
    port = free_port(LOOPBACK)
    env = {**os.environ, "BENCHFARM_WEB_TOKEN": SHARED_TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "--db", url, "web", "--port",
                             str(port)], env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://{LOOPBACK}:{port}"
    try:
        assert "token required" in proc.stderr.readline()
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(f"{base}/login")[0] == 200:
                    break
            except urllib.error.URLError:  # bound, not listening yet
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.1)
        assert get(f"{base}/api/boards")[0] == 401
        assert get(f"{base}/")[0] == 401
        assert get(f"{base}/api/boards", {"Authorization": "Bearer wrong"})[0] == 401
        status, body = get(f"{base}/api/boards", {"Authorization": f"Bearer {SHARED_TOKEN}"})
        assert status == 200 and {b["name"] for b in json.loads(body)} == {"arm-1", "x86-1"}
        login = urllib.request.Request(f"{base}/login", data=f"token={SHARED_TOKEN}".encode())
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(login, timeout=30) as response:  # the redirect carries the cookie
            assert response.status == 200 and "arm-1" in response.read().decode()
        refused = urllib.request.Request(f"{base}/login", data=b"token=guess")
        with pytest.raises(urllib.error.HTTPError) as wrong:
            urllib.request.urlopen(refused, timeout=30)
        assert wrong.value.code == 401
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_no_bind_beyond_loopback_without_a_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("BENCHFARM_WEB_TOKEN", raising=False)
    code = main(["--db", f"sqlite:///{tmp_path}/x.db", "web", "--host", "0.0.0.0"])
    assert code == 2 and "needs a token" in capsys.readouterr().err


def test_an_unreadable_store_gives_a_page(tmp_path: Path) -> None:
    garbage = tmp_path / "not-a-store.db"
    garbage.write_bytes(b"not a database at all " * 100)
    with serving(f"sqlite:///{garbage}") as base:
        status, html = get(f"{base}/")
        api_status, body = get(f"{base}/api/jobs")
    assert status == 503 and "cannot read the store" in html and "Traceback" not in html
    assert api_status == 503 and "cannot read the store" in json.loads(body)["error"]


def test_a_running_job_advances_on_the_page(
        ray_address: str, needle_model: Path, tmp_path: Path,
        browser: webdriver.Chrome) -> None:
    url = f"sqlite:///{tmp_path}/live.db"
    Store.open(url).close()
    spec = needle_spec(tmp_path, "live", needle_model, ["local"], depths=(0.1, 0.4, 0.7, 1.0),
                       ctx=256)
    inventory = slow_local_board(tmp_path, 0.8)  # 8 runs of a known length
    with serving(url) as base:
        proc = start_cli(["--db", url, "run", str(spec), "--inventory", str(inventory),
                          "--ray-address", ray_address], tmp_path)
        try:
            browser.get(base + "/")
            browser.execute_script("window.__loaded = true")
            wait = WebDriverWait(browser, 240, poll_frequency=0.2)

            def counts(driver: webdriver.Chrome) -> str | None:
                text = text_of(driver, "#jobs tr[data-job] .counts")
                return text.strip() if text and " done" in text else None

            board_row = '#boards tr[data-board="local"]'
            first = wait.until(counts)
            board = text_of(browser, board_row)
            later = wait.until(lambda d: (text := counts(d)) and text != first
                               and int(text.split()[0]) > int(first.split()[0]) and text)
            wait.until(lambda d: text_of(d, board_row) not in (None, board))
            assert browser.find_elements(By.CSS_SELECTOR, "#jobs .progress-bar .done")
            browser.save_screenshot(str(tmp_path / "running.png"))
            assert browser.execute_script("return window.__loaded") is True  # never reloaded
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            wait.until(lambda d: "done" in (text_of(d, "#finished tbody") or ""))
            assert console_errors(browser) == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        job = get_json(f"{base}/api/jobs")[0]
    assert int(later.split()[0]) >= 1
    assert (job["state"], job["total"], job["done"]) == ("done", 8, 8)
