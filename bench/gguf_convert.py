"""Command-line wrapper of :mod:`harness.engines.llamabench.gguf` (the converter lives in the
harness, which feeds GGUF models to the llama-bench engine; bench scripts import it from here as
before).

    .venv/bin/python bench/gguf_convert.py MODEL_DIR OUT.gguf --type q8_0
"""

from __future__ import annotations

import sys

from harness.engines.llamabench.gguf import (
    GGUF_TYPES,
    ConvertError,
    as_float32,
    convert,
    ensure_converted,
    gguf_name,
    gguf_path,
    main,
    read_safetensors,
)

__all__ = ["GGUF_TYPES", "ConvertError", "as_float32", "convert", "ensure_converted", "gguf_name",
           "gguf_path", "read_safetensors"]

if __name__ == "__main__":
    sys.exit(main())
