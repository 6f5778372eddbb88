"""Notification targets a submitter sends, and targets that answer slowly or print without end.
A job carries http(s) URLs only: a command, a file:// or ftp:// target, from `submit --notify`
or a spec's [notify], is exit 2 at submit, and a command in a job row written straight into a
shared store never runs in `serve` (the serve operator's own `--notify CMD` does). Delivery is
bounded as a whole: a server that answers a byte at a time is given up at the deadline, off
the caller's thread, and a command's output is capped. Real servers on loopback, the real CLI,
real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fixtures_ray import cli_here, needle_spec, start_cli

from db.store import Store
from harness import REPO_ROOT
from harness.execution import notify


def local_inventory(tmp_path: Path) -> Path:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(f'[[device]]\nname = "local"\nworkdir = "{tmp_path}/work"\n')
    return inventory


@pytest.mark.parametrize("target", [
    "touch /tmp/benchfarm-owned", "file:///etc/passwd", "ftp://127.0.0.1/x",
    "gopher://127.0.0.1:70/x", "http://"])
def test_submit_takes_http_urls_only(tmp_path: Path, needle_model: Path, target: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", f"sqlite:///{tmp_path}/notify.db"]
    spec = needle_spec(tmp_path, "notify-targets", needle_model, ["local"])
    inv = ["--inventory", str(local_inventory(tmp_path))]
    done = cli_here(capsys, *db, "submit", str(spec), *inv, "--notify", target)
    assert done.returncode == 2 and "--notify" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = cli_here(capsys, *db, "submit", str(spec), *inv, "--notify", "HTTP://127.0.0.1:9/x")
    assert done.returncode == 0, done.stderr  # the scheme in any case
    with Store.open(db[1]) as store:
        (job,) = store.jobs.list()
    assert job.notify == {"url": ["HTTP://127.0.0.1:9/x"]}


@pytest.mark.parametrize("section, key", [
    ('command = "touch /tmp/benchfarm-owned"', "notify.command"),
    ('url = ["http://127.0.0.1:9/", "file:///etc/passwd"]', "notify.url"),
])
def test_a_spec_names_notification_urls_only(tmp_path: Path, needle_model: Path, section: str,
                                             key: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = needle_spec(tmp_path, "notify-spec", needle_model, ["local"],
                       extra=f"[notify]\n{section}")
    done = cli_here(capsys, "--db", f"sqlite:///{tmp_path}/spec.db", "submit", str(spec),
                    "--inventory", str(local_inventory(tmp_path)))
    assert done.returncode == 2 and f"key '{key}'" in done.stderr, done.stderr


def test_a_command_in_a_stored_job_never_runs_in_serve(ray_address: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shared.db"
    owned, events = tmp_path / "owned", tmp_path / "events.json"
    with Store.open(url) as store:  # a row written straight into a shared store
        store.jobs.add("planted", str(tmp_path / "planted.toml"), "not a spec [",
                       owner="mallory", notify={"command": [f"touch {owned}"],
                                                "url": []})
    serve = start_cli(["--db", url, "serve", "--ray-address", ray_address, "--until-idle",
                       "--no-health-checks", "--inventory", str(local_inventory(tmp_path)),
                       "--notify", f"cat > {events}"], tmp_path)  # the operator's own
    out, err = serve.communicate(timeout=300)
    assert serve.returncode == 0, err
    assert "job 1 (planted) failed" in out
    assert not owned.exists()
    assert json.loads(events.read_text())["state"] == "failed"  # the operator's command ran


class Dribbler:
    """An HTTP server on loopback that answers one byte of its status line at a time, forever:
    every read is quick, the answer never ends."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook"
        self.stop = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.dribble, args=(conn,), daemon=True).start()

    def dribble(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100000:
                if self.stop.wait(0.2):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def test_a_target_answering_a_byte_at_a_time_is_given_up_at_its_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "TIMEOUT_S", 2.0)
    slow = Dribbler()
    try:
        outcome: list[list[str]] = []
        thread = threading.Thread(target=lambda: outcome.append(
            notify.notify({"event": "job-end"}, notify.Targets([slow.url]))), daemon=True)
        thread.start()
        thread.join(60)  # the whole answer would take hours
        assert not thread.is_alive(), "notify was still waiting for the slow server"
        (problem,) = outcome[0]
        assert "no answer within 2 s" in problem
        # announced, it returns to the caller with the delivery still pending, which is
        # given up later on the notifier's own thread
        assert notify.announce({"event": "board-bad"}, notify.Targets([slow.url]))
        assert not notify.flush(0)
        assert notify.flush(60)
    finally:
        slow.close()


# the peak of this process's own memory (VmHWM: ru_maxrss would start from pytest's)
CHATTY = """
from pathlib import Path
from harness.execution import notify
notify.TIMEOUT_S = 3.0
problems = notify.notify({"event": "job-end"},
                         notify.Targets([], ["head -c 200000000 /dev/zero; sleep 8"]))
peak = [line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmHWM:")][0]
print(peak, problems)
"""


def test_a_command_printing_without_end_is_capped_in_memory_and_time() -> None:
    done = subprocess.run([sys.executable, "-c", CHATTY], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    max_rss_kb, problems = done.stdout.split(" ", 1)
    assert int(max_rss_kb) < 150_000, done.stdout  # 200 MB printed; not held
    assert "printed more than 1 MiB; stopped" in problems
