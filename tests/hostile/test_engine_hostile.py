"""Engine inputs a hostile or unlucky user gives, under ASan + UBSan: non-finite
predictor values and configs, NaN weights, files that are not regular files, a header with very
many tensors. Each is refused (exit 2, one line naming the file) or fails the run (exit 1);
lmc never exits 0 with a document that is not JSON, and nothing waits on a FIFO."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from fixtures_engine import assert_input_error, edit_config, generate, run_lmc
from util_safetensors import read_safetensors, shard_checkpoint, write_safetensors

# one layer, one tree of three nodes over two features (the fields on line 6 and 7)
PREDICTOR = """lmc-gbm 1
features 2 prev_mass key_norm
layers 1
layer 0 baseline {baseline} trees 1
tree 3
0 {threshold} 1 2 0 0x0p+0 1
0 0x0p+0 0 0 1 {value} 0
0 0x0p+0 0 0 1 -0x1p-2 0
"""
FINE = {"baseline": "0x1.8p-1", "threshold": "0x1p+0", "value": "0x1p-2"}


def predict(lmc_asan, tmp_path: Path, text: str):
    path = tmp_path / "p.gbm"
    path.write_text(text)
    np.zeros((4, 2), dtype=np.float32).tofile(tmp_path / "x.bin")
    return path, run_lmc(lmc_asan, "predict", "--predictor", path, "--layer", 0, "--inputs",
                         tmp_path / "x.bin", "--dump-out", tmp_path / "y.bin", timeout=60)


@pytest.mark.parametrize("field, value, line", [
    ("baseline", "nan", 4), ("baseline", "1e308", 4), ("threshold", "inf", 6),
    ("threshold", "nan", 6), ("value", "-inf", 7), ("value", "1e308", 7),
])
def test_predictor_refuses_non_finite_values(lmc_asan, tmp_path, field, value, line):
    path, proc = predict(lmc_asan, tmp_path, PREDICTOR.format(**{**FINE, field: value}))
    name = {"value": "node value", "threshold": "node threshold"}.get(field, field)
    assert_input_error(proc, f"--predictor {path}: line {line}: {name} must be a finite number")


def test_a_finite_predictor_still_predicts(lmc_asan, tmp_path):
    _path, proc = predict(lmc_asan, tmp_path, PREDICTOR.format(**FINE))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"] == 4
    assert np.fromfile(tmp_path / "y.bin", dtype="<f8").tolist() == [1.0] * 4


@pytest.mark.parametrize("edit, key", [
    (lambda c: c.update(rms_norm_eps=1e39), "rms_norm_eps"),
    (lambda c: c["rope_parameters"].update(rope_theta=1e-320), "rope_theta"),
    (lambda c: c.update(model_type="minicpm", scale_emb=1e39, scale_depth=1.4,
                        dim_model_base=16), "scale_emb"),
])
def test_configs_yielding_non_finite_values_are_refused(lmc_asan, broken, prompt, edit, key):
    edit_config(broken, edit)
    assert_input_error(generate(lmc_asan, broken, prompt), f"'{key}' must be a number in")


@pytest.mark.parametrize("command", ["generate", "ppl"])
def test_nan_weights_fail_the_run_instead_of_printing_nan(lmc_asan, broken, prompt, command):
    path = broken / "model.safetensors"
    header, data = read_safetensors(path)
    begin, end = header["model.norm.weight"]["data_offsets"]
    nan = struct.pack("<H", 0x7FC0)  # a BF16 NaN
    write_safetensors(path, header, data[:begin] + nan * ((end - begin) // 2) + data[end:])
    flag = "--prompt" if command == "generate" else "--text"
    proc = run_lmc(lmc_asan, command, "--model", broken, flag, prompt, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not finite" in proc.stderr and "nan" not in proc.stdout


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("where", ["prompt", "config.json", "model.safetensors", "dev-zero",
                                   "shard", "predictor"])
def test_files_that_are_not_regular_are_refused_at_once(lmc_asan, broken, prompt, tmp_path, where):
    extra: list = []
    if where == "prompt":
        prompt = _fifo(tmp_path / "fifo")
        shown = prompt
    elif where == "dev-zero":
        prompt = shown = Path("/dev/zero")
    elif where == "shard":
        index = shard_checkpoint(broken, 2)
        shown = _fifo(broken / sorted(set(index["weight_map"].values()))[1])
    elif where == "predictor":
        shown = _fifo(tmp_path / "p.gbm")
        extra = ["--attn", "gbm", "--predictor", shown]
    else:
        shown = _fifo(broken / where)
    # a FIFO nobody writes to: an open that waited would hang here until the timeout
    proc = run_lmc(lmc_asan, "generate", "--model", broken, "--prompt", prompt, "--max-new", 2,
                   *extra, timeout=60)
    assert_input_error(proc, f"{shown} is not a regular file")


def _many_tensors_header(n: int, duplicate: bool) -> bytes:
    entries = [f'"extra.{i}": {{"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}'
               for i in range(n)]
    if duplicate:
        entries.append(entries[n // 2])
    return ", ".join(entries).encode()


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_header_with_many_tensors_loads_and_duplicates_are_found(lmc_asan, broken, prompt,
                                                                   duplicate):
    # 120k extra tensors took 23 s per load with pairwise name checks (without ASan)
    path = broken / "model.safetensors"
    header, data = read_safetensors(path)
    blob = json.dumps(header).encode()
    blob = blob[:-1] + b", " + _many_tensors_header(120_000, duplicate) + b"}"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    proc = generate(lmc_asan, broken, prompt)
    if duplicate:
        assert_input_error(proc, "tensor 'extra.60000' appears twice in the header")
    else:
        assert proc.returncode == 0, proc.stderr
        assert len(json.loads(proc.stdout)["tokens"]) == 2
