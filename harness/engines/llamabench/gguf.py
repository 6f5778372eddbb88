"""Convert a Qwen3 Hugging Face directory (F32 or BF16 safetensors) to GGUF f32, q8_0 or bf16.

llama.cpp (the ``llama-bench`` engine, ``bench/vs_llamacpp.py``) reads GGUF, so the same weights
lmc runs are written here with the ``gguf`` package's writer.
Tensors are streamed one at a time (the safetensors data is memory-mapped), so memory stays
near one tensor. Names follow llama.cpp's ``qwen3`` architecture; Qwen3 uses the rotate-half
(NeoX) RoPE in both, so no Q/K row permutation is needed.

The bench feeds token ids, never text, so the vocabulary is a placeholder: a SentencePiece-style
list with ``<unk> <s> </s>``, the 256 byte tokens llama.cpp looks up, then ``<tN>``. It only has
to have the model's vocabulary size.

    .venv/bin/python bench/gguf_convert.py MODEL_DIR OUT.gguf --type q8_0   (the CLI wrapper)
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

from devices.files import loads_json, open_regular, read_json

GGUF_TYPES = ("f32", "q8_0", "bf16")
QUANT_CHUNK_ROWS = 4096
SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2")}


class ConvertError(Exception):
    exit_code = 2


MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own bound on its header


# ---------------------------------------------------------------------------------------------
# Reading safetensors without materialising it
# ---------------------------------------------------------------------------------------------


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """name -> float32 array view/copy of each tensor (F32 memory-mapped; BF16 widened lazily)."""
    try:
        with open_regular(path) as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            if header_len > MAX_HEADER_BYTES:
                raise ConvertError(f"{path}: a safetensors header of {header_len} bytes; at most "
                                   f"{MAX_HEADER_BYTES}")
            header = loads_json(fh.read(header_len))
    except (OSError, ValueError, struct.error) as exc:
        raise ConvertError(f"{path}: not a readable safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: its safetensors header is not a JSON object")
    data_start = 8 + header_len
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConvertError(f"{path}: tensor {name} has dtype {info['dtype']}; "
                               f"allowed: {', '.join(SAFETENSORS_DTYPES)}")
        begin, end = info["data_offsets"]
        tensors[name] = (raw[data_start + begin:data_start + end].view(dtype)
                         .reshape(info["shape"]))
    return tensors


def round_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> the upper 16 bits of its nearest bfloat16 (round half to even), as uint16."""
    bits = values.astype(np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def as_float32(values: np.ndarray) -> np.ndarray:
    if values.dtype == np.float32:
        return values
    # bfloat16 is the upper half of a float32
    return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Names and metadata
# ---------------------------------------------------------------------------------------------

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model . layers . N . rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_NAMES:
        return f"blk.{int(parts[2])}.{LAYER_NAMES[parts[3]]}"
    raise ConvertError(f"tensor {hf_name} has no llama.cpp qwen3 counterpart")


def placeholder_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    if size < len(tokens):
        raise ConvertError(f"vocab_size {size} is smaller than the {len(tokens)} fixed tokens")
    tokens += [f"<t{i}>" for i in range(len(tokens), size)]
    types += [TokenType.NORMAL] * (size - len(types))
    return tokens, [0.0] * size, [int(t) for t in types]


def add_metadata(writer, config: dict, gguf_type: str) -> None:
    from gguf import LlamaFileType

    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope_theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta")
    writer.add_name("qwen3-random-bench")
    writer.add_context_length(config.get("max_position_embeddings", 40960))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(rope_theta or 1_000_000.0))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_file_type({"f32": LlamaFileType.ALL_F32, "q8_0": LlamaFileType.MOSTLY_Q8_0,
                          "bf16": LlamaFileType.MOSTLY_BF16}[gguf_type])
    tokens, scores, types = placeholder_vocab(config["vocab_size"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


# ---------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------


def stays_f32(values: np.ndarray, gguf_type: str) -> bool:
    return gguf_type == "f32" or values.ndim == 1  # vectors (norms) are always f32


def encoded_info(name: str, values: np.ndarray, gguf_type: str):
    """(shape, numpy dtype, byte size, GGML type or None) of the tensor as it is written."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if stays_f32(values, gguf_type):
        return values.shape, np.dtype(np.float32), values.size * 4, None
    if gguf_type == "bf16":
        return values.shape, np.dtype(np.uint16), values.size * 2, GGMLQuantizationType.BF16
    rows, cols = values.shape
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
    if cols % block:
        raise ConvertError(f"{name}: {cols} columns is not a multiple of {block} (q8_0)")
    byte_shape = (rows, cols // block * block_bytes)
    return byte_shape, np.dtype(np.uint8), rows * byte_shape[1], GGMLQuantizationType.Q8_0


def encode(values: np.ndarray, gguf_type: str) -> np.ndarray:
    """The bytes of one tensor as ``encoded_info`` describes them."""
    from gguf import GGMLQuantizationType, quants

    if gguf_type == "bf16" and not stays_f32(values, gguf_type):
        return np.ascontiguousarray(values if values.dtype == np.uint16
                                    else round_to_bf16_bits(values))
    values = np.ascontiguousarray(as_float32(values))
    if stays_f32(values, gguf_type):
        return values
    # in row chunks: the quantizer's temporaries are several times the input's size
    chunks = [quants.quantize(values[i:i + QUANT_CHUNK_ROWS], GGMLQuantizationType.Q8_0)
              for i in range(0, values.shape[0], QUANT_CHUNK_ROWS)]
    return np.concatenate(chunks)


def convert(model_dir: Path, out: Path, gguf_type: str = "f32") -> Path:
    """Write ``out`` (via a ``.partial`` file) from the HF directory ``model_dir``."""
    import gguf

    if gguf_type not in GGUF_TYPES:
        raise ConvertError(f"unknown GGUF type {gguf_type!r}; allowed: {', '.join(GGUF_TYPES)}")
    config_path = model_dir / "config.json"
    weights_path = model_dir / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ConvertError(f"{path} does not exist "
                               "(a model is config.json + model.safetensors)")
    try:
        config = read_json(config_path)
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{config_path}: cannot read it as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{config_path}: must be a JSON object")
    if config.get("model_type") != "qwen3":
        raise ConvertError(f"{config_path}: model_type {config.get('model_type')!r}; "
                           "allowed: qwen3")
    tensors = read_safetensors(weights_path)
    names = [(gguf_name(name), name) for name in tensors]

    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(partial, "qwen3")
    add_metadata(writer, config, gguf_type)
    # First pass: tensor infos (shapes and byte sizes) so the header can be written up front.
    for target, name in names:
        shape, dtype, nbytes, raw_dtype = encoded_info(name, tensors[name], gguf_type)
        writer.add_tensor_info(target, shape, dtype, nbytes, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # Second pass: data, one tensor in memory at a time.
    for _, name in names:
        writer.write_tensor_data(encode(tensors[name], gguf_type))
    writer.close()
    partial.replace(out)
    return out


def gguf_path(model_dir: Path, gguf_type: str) -> Path:
    """Where the bench keeps the conversion of ``model_dir``: next to it, by type."""
    return model_dir / f"model-{gguf_type}.gguf"


def ensure_converted(model_dir: Path, gguf_type: str, out: Path | None = None) -> Path:
    """Convert once into ``out`` (default ``gguf_path``); reuse when the GGUF is newer than the
    safetensors file."""
    out = out or gguf_path(model_dir, gguf_type)
    source = model_dir / "model.safetensors"
    if out.is_file() and source.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    return convert(model_dir, out, gguf_type)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path, nargs="?", help="default: MODEL_DIR/model-TYPE.gguf")
    parser.add_argument("--type", choices=GGUF_TYPES, default="f32")
    args = parser.parse_args(argv)
    try:
        out = convert(args.model_dir, args.out or gguf_path(args.model_dir, args.type), args.type)
    except ConvertError as exc:
        print(f"gguf_convert: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
