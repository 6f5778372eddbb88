"""Reading the files a user names: spec and inventory TOML, claims, prompt material, SSH keys,
known_hosts.

Only a regular file is read: it is opened non-blocking and checked with ``fstat`` before a
byte is read, so a FIFO, ``/dev/zero`` or a directory is refused at once instead of hanging
the command (or a whole ``serve``) or reading until memory runs out. Every read is capped at
``MAX_FILE_BYTES``. The refusals are ``OSError``s with a ``strerror`` that says what is wrong,
so each caller's "cannot read FILE: ..." message names them. TOML nested deeper than Python's
recursion allows is a ``TOMLDecodeError`` like any other malformed TOML.

The lowest layer that every reader can import (harness, reports and devices itself), which is
why it lives here.
"""

from __future__ import annotations

import errno
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

# far above any spec, inventory, claims file, key or prompt text (the largest are a few MB)
MAX_FILE_BYTES = 64 << 20


def read_bytes(path: Path | str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) \
                else "a device or socket"
            raise OSError(errno.EINVAL, f"not a regular file (it is {kind})", str(path))
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB, the most read", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int = MAX_FILE_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8 (UnicodeDecodeError for other bytes)."""
    return read_bytes(path, limit).decode("utf-8")


class UnreadableToml(ValueError):
    """A TOML file that cannot be read or is not UTF-8; its message names the file."""


def read_toml_text(path: Path, what: str) -> str:
    """The text of the TOML file ``path`` (``what`` it is, e.g. "spec"), or UnreadableToml
    with the message a user acts on: why it cannot be read, or where its first byte that is
    not UTF-8 is."""
    try:
        return read_text(path)
    except OSError as exc:
        raise UnreadableToml(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UnreadableToml(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                             f"offset {exc.start}); TOML files must be UTF-8") from None


def loads_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads``, with arrays or inline tables nested too deep for the parser's
    recursion refused as malformed TOML instead of a RecursionError."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError("arrays or inline tables nested too deeply "
                                      "(a few hundred levels)") from None
