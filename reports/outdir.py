"""The folder a report, comparison or audit is written into (``--out``), and the default one.

Reports go under ``out/reports/<name>/`` (relative to where the command runs) unless ``--out``
names another folder: outside the Python packages, so that nothing generated sits beside code.

It is made and proven writable before anything is rendered, so that a path onto an existing
file, into a read-only file system or a folder without write permission is a one-line input
error naming ``--out`` instead of a traceback halfway through the files.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from reports.errors import ReportInputError

DEFAULT_ROOT = Path("out") / "reports"


def default_report_dir(name: str) -> Path:
    """Where the report of ``name`` (an experiment, the demo, a study) goes by default."""
    return DEFAULT_ROOT / name


def output_dir(path: str | Path) -> Path:
    """``path`` as a folder that exists and takes new files (existing files are replaced)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except (FileExistsError, NotADirectoryError):
        raise ReportInputError(f"--out {out}: it, or a folder above it, is a file; name a "
                               "folder") from None
    except OSError as exc:
        raise ReportInputError(f"--out {out}: cannot write there ({exc.strerror or exc}); "
                               "name a writable folder") from None
    return out
