"""Write seed inputs for fuzz_loader into a directory (stdlib only).

Usage: python3 engine/fuzz/make_corpus.py CORPUS_DIR
Seeds: valid config.json files of every architecture (odd first byte), a sharded checkpoint's
index (first byte 2), a predictor file (first byte 4) and a valid safetensors image for the fuzz
target's fixed config (first byte 0), in BF16 and F32.
"""

import json
import struct
import sys
from pathlib import Path

HIDDEN, INTER, HEADS, KV, HEAD_DIM, VOCAB = 8, 16, 2, 1, 4, 16

CONFIG = {
    "model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": INTER,
    "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV,
    "head_dim": HEAD_DIM, "vocab_size": VOCAB, "max_position_embeddings": 64,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
}


def shapes() -> dict[str, list[int]]:
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": [VOCAB, HIDDEN], "model.norm.weight": [HIDDEN],
        p + "input_layernorm.weight": [HIDDEN], p + "post_attention_layernorm.weight": [HIDDEN],
        p + "self_attn.q_proj.weight": [q, HIDDEN], p + "self_attn.k_proj.weight": [kv, HIDDEN],
        p + "self_attn.v_proj.weight": [kv, HIDDEN], p + "self_attn.o_proj.weight": [HIDDEN, q],
        p + "self_attn.q_norm.weight": [HEAD_DIM], p + "self_attn.k_norm.weight": [HEAD_DIM],
        p + "mlp.gate_proj.weight": [INTER, HIDDEN], p + "mlp.up_proj.weight": [INTER, HIDDEN],
        p + "mlp.down_proj.weight": [HIDDEN, INTER],
    }


def safetensors(dtype: str, size: int) -> bytes:
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in shapes().items():
        numel = 1
        for d in shape:
            numel *= d
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + numel * size]}
        data += bytes((i * 7) % 251 for i in range(numel * size))
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


ROPE = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
CONFIGS = {
    "config": CONFIG,
    "config_llama3": {**CONFIG, "model_type": "llama", "rope_parameters": ROPE},
    "config_minicpm": {**CONFIG, "model_type": "minicpm", "scale_emb": 12, "scale_depth": 1.4,
                       "dim_model_base": 256},
    "config_qwen3_vl": {"model_type": "qwen3_vl", "text_config": CONFIG,
                        "vision_config": {"depth": 1}},
}


# two layers of small trees over two features, floats in C99 hex as the exporter writes them
PREDICTOR = """lmc-gbm 1
features 2 f0 f1
layers 2
layer 0 baseline 0x1.8p-1 trees 2
tree 3
0 0x1p+0 1 2 0 0x0p+0 1
0 0x0p+0 0 0 1 0x1p-2 0
0 0x0p+0 0 0 1 -0x1p-2 0
tree 1
0 0x0p+0 0 0 1 0x1p-4 0
layer 1 baseline -1.5 trees 1
tree 3
1 0x1.4p+1 1 2 0 0x0p+0 0
0 0x0p+0 0 0 1 1e3 0
0 0x0p+0 0 0 1 -2e-3 1
"""


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, config in CONFIGS.items():
        (out / name).write_bytes(b"\x01" + json.dumps(config).encode())
    index = {"metadata": {"total_size": 1}, "weight_map": {
        name: f"model-0000{i % 2 + 1}-of-00002.safetensors" for i, name in enumerate(shapes())}}
    (out / "index").write_bytes(b"\x02" + json.dumps(index).encode())
    (out / "predictor").write_bytes(b"\x04" + PREDICTOR.encode())
    (out / "st_bf16").write_bytes(b"\x00" + safetensors("BF16", 2))
    (out / "st_f32").write_bytes(b"\x00" + safetensors("F32", 4))


if __name__ == "__main__":
    main()
