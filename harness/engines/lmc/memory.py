"""The bytes of lmc's resident weights for a model, from its config.json: the same sum as the
engine's ``weights_bytes`` (engine/loader.c, model_weight_bytes), so that a run a board cannot
hold is refused before it starts (harness.plan.fit). Matrices (the lm_head included, tied or
not) stay in their ``--wq`` format, the norms in f32; the embedding table is not resident (lmc
reads a looked-up row from the checkpoint's file)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Q8_GROUP = 32  # engine/ops.h: one binary16 scale per 32 int8 values


def text_config(document: Any) -> dict[str, Any]:
    """The text model's part of a config.json document (Qwen3-VL nests it)."""
    if not isinstance(document, dict):
        raise ValueError("config.json is not an object")
    return document.get("text_config", document)


def matrix_bytes(rows: int, cols: int, wq: str) -> int:
    if wq == "q8":
        return rows * -(-cols // Q8_GROUP) * (Q8_GROUP + 2)
    return rows * cols * (2 if wq == "bf16" else 4)


def resident_bytes(config: Mapping[str, Any], wq: str) -> int:
    """lmc's resident weights for a model of ``config`` at ``--wq wq``."""
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = (matrix_bytes(q, hidden, wq) + 2 * matrix_bytes(kv, hidden, wq)
                 + matrix_bytes(hidden, q, wq) + 2 * matrix_bytes(inter, hidden, wq)
                 + matrix_bytes(hidden, inter, wq))
    norms = hidden + layers * (2 * hidden + 2 * head_dim)
    return layers * per_layer + matrix_bytes(vocab, hidden, wq) + norms * 4
