"""Notifications: a job's end, a board going bad (and whatever else calls ``notify``).

A target is an ``http://`` or ``https://`` URL (the scheme in any case), to which the event is
POSTed as JSON, or a shell command, which gets the event as JSON on its stdin and in
``$BENCHFARM_EVENT``.

Who may name which (nothing a submitter sends executes on a coordinator): a job carries URLs
only. A spec's ``[notify]`` section takes ``url`` (a string or a list); ``submit --notify``
takes URLs; a job row holding anything else (written into a shared store by hand) has its
commands ignored by ``serve``. Commands come only from the operator of the process that runs
them, on its own command line: ``serve --notify CMD`` (every job's end, every board going bad),
and for one's own one-shot ``run``, ``track`` and ``devices check`` their ``--notify CMD``
(run as the user who typed it; a one-shot ``run`` stores only its URLs with its job). Any other
``SCHEME://`` (``file://``, ``ftp://`` ...) is refused wherever it is given.

Delivery is bounded as a whole: one deadline per target (``TIMEOUT_S``, however slowly a
server answers: a watchdog closes the connection when it passes), at most ``MAX_OUTPUT_BYTES``
read of an answer or of a command's output (a command that prints more is stopped, with its
process group), and ``announce`` delivers off the caller's thread (a scheduler's, serve's
loop), in order, at most ``MAX_PENDING`` waiting (more are dropped with a warning); a process
delivers what it announced, each target within its deadline, before it exits. A
notification that cannot be delivered is reported on stderr and never fails the job.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from harness.spec.targets import URL_SCHEMES, TargetRefused, checked_url, is_url, scheme_of

__all__ = ["TargetRefused", "Targets", "announce", "checked_url", "flush", "is_url",
           "job_targets", "notify", "post", "run_command", "targets_from"]

TIMEOUT_S = 10.0  # each target: the whole request, or the command from start to end
MAX_OUTPUT_BYTES = 1 << 20  # read of an answer, or of a command's stdout and stderr together
MAX_PENDING = 16  # deliveries in flight off the caller's thread


@dataclass(frozen=True)
class Targets:
    urls: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.urls or self.commands)

    def __add__(self, other: Targets) -> Targets:
        return Targets(self.urls + [u for u in other.urls if u not in self.urls],
                       self.commands + [c for c in other.commands if c not in self.commands])

    def as_dict(self) -> dict[str, list[str]]:
        """What a job row keeps: its URLs (never a command: see the module's docstring)."""
        return {"url": list(self.urls)}


def targets_from(flags: list[str] | None = None,
                 section: dict[str, Any] | None = None, commands: bool = True) -> Targets:
    """``--notify`` values (commands only with ``commands``: the operator's own flags) and a
    ``[notify]`` section (URLs only); TargetRefused for anything else."""
    section = section or {}
    value = section.get("url") or []
    urls = [checked_url(u, "[notify] url") for u in ([value] if isinstance(value, str)
                                                       else list(value))]
    cmds = []
    for flag in flags or []:
        if scheme_of(flag) is not None or not commands:
            urls.append(checked_url(flag, "--notify"))
        else:
            cmds.append(flag)
    return Targets(list(dict.fromkeys(urls)), cmds)


def job_targets(stored: dict[str, Any] | None) -> Targets:
    """The targets a stored job row may carry: its http(s) URLs. Anything else (a command
    written into a shared store by hand) is ignored, with a warning: it never runs."""
    stored = stored or {}
    value = stored.get("url") or []
    urls = [u for u in ([value] if isinstance(value, str) else list(value))
            if isinstance(u, str) and is_url(u)]
    ignored = [u for u in ([value] if isinstance(value, str) else list(value)) if u not in urls]
    ignored += [c for c in ([stored["command"]] if isinstance(stored.get("command"), str)
                            else list(stored.get("command") or []))]
    if ignored:
        print(f"benchfarm: warning: a stored job names notification targets that are not "
              f"http(s) URLs; ignored ({len(ignored)}): a job may carry URLs only",
              file=sys.stderr, flush=True)
    return Targets(urls)


def notify(event: dict[str, Any], targets: Targets) -> list[str]:
    """Deliver ``event`` to every target now, each within ``TIMEOUT_S``; returns (and prints)
    what could not be delivered."""
    body = json.dumps(event, sort_keys=True, default=str).encode()
    problems = [p for p in (post(url, body) for url in targets.urls) if p]
    problems += [p for p in (run_command(command, body) for command in targets.commands) if p]
    for problem in problems:
        print(f"benchfarm: warning: {problem}", file=sys.stderr, flush=True)
    return problems


class _Deliveries:
    """One worker thread delivering queued events in order, off the threads that announce
    them; at most ``MAX_PENDING`` wait (more are dropped with a warning)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[dict[str, Any], Targets]] = queue.Queue(MAX_PENDING)
        self.lock = threading.Lock()
        self.worker: threading.Thread | None = None

    def put(self, event: dict[str, Any], targets: Targets) -> bool:
        try:
            self.queue.put_nowait((event, targets))
        except queue.Full:
            print(f"benchfarm: warning: notify: {MAX_PENDING} notifications wait to be "
                  f"delivered; the {event.get('event', 'event')} event was dropped",
                  file=sys.stderr, flush=True)
            return False
        with self.lock:
            if self.worker is None or not self.worker.is_alive():
                self.worker = threading.Thread(target=self._work, name="benchfarm-notify",
                                               daemon=True)
                self.worker.start()
        return True

    def _work(self) -> None:
        while True:
            event, targets = self.queue.get()
            try:
                notify(event, targets)
            except Exception as exc:  # noqa: BLE001 - a notification never stops anything
                print(f"benchfarm: warning: notify: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
            finally:
                self.queue.task_done()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued event was delivered (or given up); whether it was."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.queue.unfinished_tasks:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True


_deliveries = _Deliveries()
# a process that ends delivers what it announced first (each target within its deadline)
atexit.register(_deliveries.flush, MAX_PENDING * 2 * TIMEOUT_S)


def announce(event: dict[str, Any], targets: Targets) -> bool:
    """``notify`` off the caller's thread, in the order announced: returns at once (whether
    the event was queued). ``flush`` waits for the deliveries."""
    return bool(targets) and _deliveries.put(event, targets)


def flush(timeout: float | None = None) -> bool:
    """Wait until what was announced is delivered (each target within its deadline)."""
    return _deliveries.flush(timeout)


def post(url: str, body: bytes, timeout: float | None = None) -> str | None:
    """POST ``body`` to ``url`` within ``timeout`` (``TIMEOUT_S``) as a whole; the problem, or
    None when it was delivered (any 2xx or 3xx answer)."""
    timeout = TIMEOUT_S if timeout is None else timeout
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in URL_SCHEMES or not parts.hostname:
            return f"notify {url}: not an http(s) URL"
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=timeout)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    except ValueError as exc:
        return f"notify {url}: {exc}"
    expired = threading.Event()

    def cut() -> None:  # the deadline: whatever the connection waits for ends now
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.request("POST", path, body=body,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read(MAX_OUTPUT_BYTES)  # what is left is not read
        status = response.status
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set():
            return f"notify {url}: no answer within {timeout:g} s; given up"
        return f"notify {url}: {exc or type(exc).__name__}"
    finally:
        watchdog.cancel()
        connection.close()
    if expired.is_set():
        return f"notify {url}: no answer within {timeout:g} s; given up"
    if not 200 <= status < 400:
        return f"notify {url}: HTTP {status}"
    return None


def run_command(command: str, body: bytes, timeout: float | None = None) -> str | None:
    """Run ``command`` with ``sh -c``, the event on its stdin and in ``$BENCHFARM_EVENT``,
    within ``timeout`` (``TIMEOUT_S``) and ``MAX_OUTPUT_BYTES`` of output (its process group
    is killed past either); the problem, or None when it exited 0."""
    timeout = TIMEOUT_S if timeout is None else timeout
    with tempfile.TemporaryFile() as stdin:
        stdin.write(body)
        stdin.seek(0)
        try:
            proc = subprocess.Popen(["sh", "-c", command], stdin=stdin, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    env={**os.environ, "BENCHFARM_EVENT": body.decode()})
        except OSError as exc:
            return f"notify `{command}`: cannot start it ({exc})"
    deadline = time.monotonic() + timeout
    stderr_tail, size, why = b"", 0, None
    with selectors.DefaultSelector() as selector:
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"still running after {timeout:g} s; stopped"
                break
            for key, _ in selector.select(min(left, 0.5)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                size += len(chunk)
                if key.fileobj is proc.stderr:
                    stderr_tail = (stderr_tail + chunk)[-4096:]
            if size > MAX_OUTPUT_BYTES:
                why = f"printed more than {MAX_OUTPUT_BYTES >> 20} MiB; stopped"
                break
            if proc.poll() is not None and not selector.select(0):
                break  # it ended; what it left running in the background is stopped below
    if why is None:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            why = f"still running after {timeout:g} s; stopped"
    _kill_group(proc)  # past a limit, or what an ended command left behind
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    if why is not None:
        return f"notify `{command}`: {why}"
    if proc.returncode != 0:
        tail = stderr_tail.decode("utf-8", "replace").strip()[-200:]
        return f"notify `{command}`: exit code {proc.returncode}: {tail}"
    return None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def job_end(store: Any, job_id: int) -> dict[str, Any]:
    """The document announcing a job's end: its counts as integers (its attempts per status,
    and the runs of its matrix), its times in ISO 8601 with their zone."""
    from db.job_events import aware
    from db.records import RUN_STATUSES

    job = store.jobs.get(job_id)
    counts = store.jobs.attempt_counts(job_id)
    stamps = {name: None if (moment := aware(getattr(job, name))) is None
              else moment.isoformat() for name in ("submitted_at", "started_at", "finished_at")}
    return {"event": "job-end", "job": job.id, "experiment": job.experiment,
            "owner": job.owner, "state": job.state, "message": job.message,
            "cancelled_by": job.cancelled_by,
            "counts": {status: int(counts.get(status, 0)) for status in RUN_STATUSES},
            "matrix_runs": sum(int(n) for n in (job.totals or {}).values()), **stamps}


def announce_job(store: Any, job_id: int, targets: Targets) -> None:
    """Tell the job's notification targets that it ended, and how (``job_end``; off this
    thread: harness.execution.notify.announce)."""
    if targets:
        announce(job_end(store, job_id), targets)
