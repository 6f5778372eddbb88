"""Errors of the reports package, with the ``exit_code`` convention the CLI maps to exit codes.

``reports`` reads ``db`` only, so it defines its own pair (as ``devices`` and ``db`` do).
"""


class ReportError(Exception):
    """A failure while producing a report, a comparison or an audit."""

    exit_code = 1


class ReportInputError(ReportError):
    """Bad input: a malformed claims file, an unknown device or revision to compare."""

    exit_code = 2
