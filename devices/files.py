"""Reading the files a user names: spec and inventory TOML, claims, prompt material, SSH keys,
known_hosts.

Only a regular file is read: it is opened non-blocking and checked with ``fstat`` before a
byte is read, so a FIFO, ``/dev/zero`` or a directory is refused at once instead of hanging
the command (or a whole ``serve``) or reading until memory runs out. Every read is capped at
``MAX_FILE_BYTES``. The refusals are ``OSError``s with a ``strerror`` that says what is wrong,
so each caller's "cannot read FILE: ..." message names them. TOML nested deeper than Python's
recursion allows is a ``TOMLDecodeError`` like any other malformed TOML; JSON (a model's
config.json, a tokenizer's) is read by ``read_json``, which refuses nesting deeper than
``MAX_JSON_DEPTH`` as malformed JSON (a ``ValueError``) instead of a ``RecursionError``.
``open_regular`` opens a file too large to read whole (model weights) for hashing, with the
same refusal of anything but a regular file.

The lowest layer that every reader can import (harness, reports and devices itself), which is
why it lives here.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, BinaryIO

# far above any spec, inventory, claims file, key or prompt text (the largest are a few MB)
MAX_FILE_BYTES = 64 << 20
# far above any model or tokenizer configuration (a few levels); Python's own parser fails
# with a RecursionError near a thousand
MAX_JSON_DEPTH = 64


def _open_regular_fd(path: Path | str) -> int:
    """A file descriptor of ``path`` when it is a regular file (opened non-blocking, so a FIFO
    does not hang the open); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) \
                else "a device or socket"
            raise OSError(errno.EINVAL, f"not a regular file (it is {kind})", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path | str) -> BinaryIO:
    """``path`` opened for reading in binary when it is a regular file; OSError otherwise."""
    return os.fdopen(_open_regular_fd(path), "rb")


def read_bytes(path: Path | str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; OSError otherwise."""
    fd = _open_regular_fd(path)
    try:
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


def json_depth(value: object) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar: 0), without
    recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def loads_json(text: str | bytes, depth: int = MAX_JSON_DEPTH) -> object:
    """``json.loads`` with arrays and objects nested deeper than ``depth`` refused as malformed
    JSON (ValueError), never a RecursionError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"arrays or objects nested more than {depth} deep") from None
    if json_depth(value) > depth:
        raise ValueError(f"arrays or objects nested more than {depth} deep")
    return value


def read_json(path: Path | str, limit: int = MAX_FILE_BYTES) -> object:
    """A JSON file read through ``read_bytes`` (regular, at most ``limit`` bytes) and parsed by
    ``loads_json``: OSError when it cannot be read, ValueError when it is not JSON (or is not
    UTF-8, or nests too deeply)."""
    return loads_json(read_bytes(path, limit))
