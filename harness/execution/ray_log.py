"""Ray's own messages go to a log file, not to the user's terminal.

Ray warns on every start (token authentication) and, when a node is lost, prints the error
messages its GCS publishes, raylet log tails included (some fifty lines), onto the driver's
stdout. benchfarm says what happened in its own words; Ray's text is kept in a file for
whoever needs it, and that file is named in one line on stderr when a session starts.

The file: ``$BENCHFARM_RAY_LOG`` if set, else ``ray-<UTC time>-<pid>.log`` in
``$XDG_STATE_HOME/benchfarm`` (default ``~/.local/state/benchfarm``), where the newest
``KEEP_LOGS`` of them are kept.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray._private.worker as ray_worker

RAY_LOGGER = "ray"
KEEP_LOGS = 50  # of the sessions' own files in the state folder, the newest kept
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_path() -> Path:
    if os.environ.get("BENCHFARM_RAY_LOG"):
        return Path(os.environ["BENCHFARM_RAY_LOG"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(state) / "benchfarm" / f"ray-{stamp}-{os.getpid()}.log"


def _published_to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    """In place of Ray's printer of the errors its GCS publishes to drivers (a lost node's
    message and log tails): the lines go to Ray's logger, that is to the file."""
    logger = logging.getLogger(f"{RAY_LOGGER}.published")
    for line in data.get("lines", []):
        logger.warning("(%s) %s", data.get("pid", "ray"), line)


class _RayRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name == RAY_LOGGER or record.name.startswith(RAY_LOGGER + ".")


def keep_ray_off_the_terminal() -> Path:
    """Send Ray's Python loggers and its published error messages to the log file (call
    before ``ray.init(configure_logging=False)``); returns the file, named on stderr.

    ``configure_logging=False`` makes ray.init remove the handlers of its "ray" logger (its
    stderr one, and any put there); the records then go up to a handler on the root logger
    that takes Ray's records only."""
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not os.environ.get("BENCHFARM_RAY_LOG"):
        for old in sorted(path.parent.glob("ray-*.log"))[:-KEEP_LOGS]:
            old.unlink(missing_ok=True)
    root = logging.getLogger()
    if not any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in root.handlers):
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(_RayRecords())
        root.addHandler(handler)
    logging.getLogger(RAY_LOGGER).propagate = True
    ray_worker.print_to_stdstream = _published_to_log
    print(f"benchfarm: Ray's own messages are in {path}", file=sys.stderr)
    return path
