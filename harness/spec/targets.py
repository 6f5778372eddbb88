"""Notification targets a job may carry: ``http://`` and ``https://`` URLs (the scheme in any
case), nothing else (harness.execution.notify delivers them; commands are the operator's own).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from harness.errors import InputError

URL_SCHEMES = ("http", "https")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
MAX_URL_CHARS = 2000


class TargetRefused(InputError):
    """A notification target that may not be used where it was given (exit 2)."""


def scheme_of(text: str) -> str | None:
    """The lower-cased scheme of ``SCHEME://...``, or None."""
    found = _SCHEME.match(text.strip())
    return found.group(1).lower() if found else None


def is_url(text: str) -> bool:
    """An http(s) URL (any case of the scheme)."""
    return scheme_of(text) in URL_SCHEMES


def checked_url(text: str, where: str) -> str:
    """``text`` stripped when it is an http(s) URL with a host; TargetRefused naming ``where``
    otherwise."""
    if scheme_of(text) not in URL_SCHEMES:
        raise TargetRefused(f"{where}: {text[:200]!r} is not an http:// or https:// URL (a job "
                            "may carry only those; notification commands are the operator's "
                            "own: `serve --notify CMD`)")
    if len(text) > MAX_URL_CHARS:
        raise TargetRefused(f"{where}: a URL of {len(text)} characters; at most "
                            f"{MAX_URL_CHARS}")
    try:
        host = urlsplit(text.strip()).hostname
    except ValueError:
        host = None
    if not host:
        raise TargetRefused(f"{where}: {text[:200]!r} names no host")
    return text.strip()
