"""Tokens: a user's, made here and stored as its SHA-256 only, read from a file that only its
user may read; and the shared token `benchfarm web --token` may take.

A user's token is 32 random bytes (``secrets``), URL-safe base64 with a ``bf_`` prefix: too
long to guess, so a plain SHA-256 is its safe stored form, looked up by that hash. The file
is ``$BENCHFARM_TOKEN_FILE``, else ``~/.config/benchfarm/token``; it must be a regular file of
the user running benchfarm that no one else may read or write (mode 0600), as ssh asks of a
private key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path

from harness.errors import InputError

TOKEN_FILE_ENV = "BENCHFARM_TOKEN_FILE"
DEFAULT_TOKEN_FILE = "~/.config/benchfarm/token"
TOKEN_BYTES = 32  # randomness of a user's token
TOKEN_PREFIX = "bf_"
MIN_TOKEN_CHARS = 16  # the shortest token anything accepts (a dashboard's shared one too)
MAX_TOKEN_CHARS = 1024  # the longest
PRIVATE = 0o600


class TokenError(InputError):
    """A token that cannot be used as one, or a token file that cannot be trusted (exit 2)."""


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_sha256(token: str) -> str:
    """What the store keeps of a user's token."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_token(token: str, what: str) -> str:
    """``token`` if it can be one: 16 to 1024 printable ASCII characters, no spaces (a blank
    or short token is guessed; a space is what a form's ``+`` decodes to)."""
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS \
            or not all("!" <= c <= "~" for c in token):
        raise TokenError(f"{what}: a token must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} "
                         "printable ASCII characters without spaces (e.g. `openssl rand -hex "
                         "16`; a user's own: `benchfarm users add NAME`)")
    return token


def token_file() -> Path:
    """Where this user's token is kept: ``$BENCHFARM_TOKEN_FILE``, else the default."""
    return Path(os.environ.get(TOKEN_FILE_ENV) or DEFAULT_TOKEN_FILE).expanduser()


def read_token_file(path: Path) -> str | None:
    """The token in ``path``; None when there is no such file. TokenError for a file that is
    not the caller's own regular file of mode 0600 (saying how to fix it), or no token."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TokenError(f"token file {path}: cannot read it ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"token file {path}: not a regular file")
        if info.st_uid != os.geteuid():
            raise TokenError(f"token file {path} belongs to uid {info.st_uid}, not to you (uid "
                             f"{os.geteuid()}): a token is its own user's; use yours "
                             f"(${TOKEN_FILE_ENV} names another file)")
        if info.st_mode & 0o077:
            raise TokenError(f"token file {path} is open to others (mode "
                             f"{stat.S_IMODE(info.st_mode):04o}): run `chmod 600 {path}`, and "
                             "if someone may have read it, ask an admin for a new token")
        data = os.read(fd, MAX_TOKEN_CHARS + 2)
    finally:
        os.close(fd)
    try:
        return check_token(data.decode("ascii").strip(), f"token file {path}")
    except UnicodeDecodeError:
        raise TokenError(f"token file {path}: not a token (not ASCII text)") from None


def write_token_file(path: Path, token: str) -> None:
    """Keep ``token`` in ``path`` (mode 0600, its folder made 0700); an existing file is not
    replaced (it may be another store's token)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
    except FileExistsError:
        raise TokenError(f"token file {path} exists; remove it first (or set "
                         f"${TOKEN_FILE_ENV} to another file)") from None
    except OSError as exc:
        raise TokenError(f"token file {path}: cannot write it ({exc.strerror})") from None
    try:
        os.fchmod(fd, PRIVATE)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
