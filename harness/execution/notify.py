"""Notifications: a job's end, a board going bad (and whatever else calls ``notify``).

A target is a URL (http:// or https://), to which the event is POSTed as JSON, or a shell
command, which gets the event as JSON on its stdin and in ``$BENCHFARM_EVENT``. Targets come
from a spec's ``[notify]`` section (``url``, ``command``: a string or a list of them) and from
``--notify`` (repeatable; a URL or a command). A notification that cannot be delivered is
reported on stderr and never fails the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 10.0


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
        return {"url": list(self.urls), "command": list(self.commands)}


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def targets_from(flags: list[str] | None = None,
                 section: dict[str, Any] | None = None) -> Targets:
    """``--notify`` values and a ``[notify]`` section (or a stored job's) as targets."""
    section = section or {}

    def listed(key: str) -> list[str]:
        value = section.get(key) or []
        return [value] if isinstance(value, str) else list(value)

    flags = flags or []
    return Targets(listed("url") + [f for f in flags if is_url(f)],
                   listed("command") + [f for f in flags if not is_url(f)])


def notify(event: dict[str, Any], targets: Targets) -> list[str]:
    """Deliver ``event`` to every target; returns (and prints) what could not be delivered."""
    body = json.dumps(event, sort_keys=True, default=str)
    problems = []
    for url in targets.urls:
        request = urllib.request.Request(url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problems.append(f"notify {url}: {getattr(exc, 'reason', None) or exc}")
    for command in targets.commands:
        try:
            done = subprocess.run(["sh", "-c", command], input=body, text=True,
                                  capture_output=True, timeout=TIMEOUT_S,
                                  env={**os.environ, "BENCHFARM_EVENT": body})
        except subprocess.TimeoutExpired:
            problems.append(f"notify `{command}`: still running after {TIMEOUT_S:g} s; left")
            continue
        if done.returncode != 0:
            problems.append(f"notify `{command}`: exit code {done.returncode}: "
                            f"{done.stderr.strip()[:200]}")
    for problem in problems:
        print(f"benchfarm: warning: {problem}", file=sys.stderr)
    return problems
