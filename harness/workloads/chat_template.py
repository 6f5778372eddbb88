"""A model folder's chat template, rendered as transformers' ``apply_chat_template`` does
(jinja2's immutable sandbox, trim_blocks, lstrip_blocks, loop controls, ``raise_exception``,
``tojson``) but bounded: the template is the folder's code, and nested loops hung the
coordinator. ``render`` runs it in a child process (this file, run by ``python -I``: jinja2
is all it imports) that is killed after ``RENDER_TIMEOUT_S``, stops at ``MAX_RENDER_CHARS`` of
output and may map at most ``MAX_CHILD_BYTES`` of memory (``RLIMIT_AS``: a template that
builds a gigabyte string fails with a MemoryError instead of taking the coordinator's memory);
the result is cached per template and context (the message contents are markers, so one
render serves every prompt of a structure).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_TIMEOUT_S = 10.0
# the template's own text around the (marker) contents: real ones render a few KiB
MAX_RENDER_CHARS = 1 << 20
# the child's address space: Python with jinja2 maps about 100 MiB; a render of MAX_RENDER_CHARS
# needs a few MiB more
MAX_CHILD_BYTES = 512 << 20


class TemplateFailed(Exception):
    """The template did not render: an error of its own, too slow, or too much output."""


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template under transformers' settings (TemplateSyntaxError when it is not jinja2)."""
    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def render(source: str, context: dict[str, Any]) -> str:
    """The rendered template; TemplateFailed with a one-line reason otherwise."""
    return _render_cached(source, json.dumps(context, sort_keys=True))


@lru_cache(maxsize=64)
def _render_cached(source: str, context: str) -> str:
    request = json.dumps({"source": source, "context": json.loads(context)})
    try:
        child = subprocess.run([sys.executable, "-I", __file__], input=request,
                               capture_output=True, text=True, timeout=RENDER_TIMEOUT_S,
                               check=False)
    except subprocess.TimeoutExpired:
        raise TemplateFailed(f"it ran over {RENDER_TIMEOUT_S:.0f} s (loops too large?) and was "
                             "stopped") from None
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines() or [f"exit status {child.returncode}"]
        if lines[-1].startswith("MemoryError"):
            raise TemplateFailed(f"it needs more than the {MAX_CHILD_BYTES >> 20} MiB of memory "
                                 "a template may use (MemoryError)")
        raise TemplateFailed(lines[-1])
    return json.loads(child.stdout)


def _child() -> None:
    """Render the request on stdin; the text on stdout as JSON, or one line on stderr."""
    resource.setrlimit(resource.RLIMIT_AS, (MAX_CHILD_BYTES, MAX_CHILD_BYTES))
    request = json.load(sys.stdin)
    sys.setrecursionlimit(400)
    try:
        pieces, size = [], 0
        for piece in compile_template(request["source"]).generate(**request["context"]):
            size += len(piece)
            if size > MAX_RENDER_CHARS:
                raise TemplateFailed(f"it renders more than {MAX_RENDER_CHARS} characters")
            pieces.append(piece)
    except (jinja2.TemplateError, TemplateFailed, RecursionError, MemoryError, ValueError,
            TypeError, OverflowError) as exc:
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
    json.dump("".join(pieces), sys.stdout)


if __name__ == "__main__":
    _child()
