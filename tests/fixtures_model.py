"""Fixtures for the model area: the shipped needle model and throw-away tokenizer directories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NEEDLE_MODEL = Path(__file__).resolve().parents[1] / "models" / "needle-tiny"


@pytest.fixture(scope="session")
def needle_model() -> Path:
    """The shipped needle-retrieval Qwen3 model directory (HF layout)."""
    assert (NEEDLE_MODEL / "model.safetensors").is_file(), f"{NEEDLE_MODEL}: model missing"
    return NEEDLE_MODEL


@pytest.fixture(scope="session")
def needle_tokenizer() -> Path:
    """The needle model directory, for tests that only need its tokenizer and chat template."""
    assert (NEEDLE_MODEL / "tokenizer.json").is_file(), f"{NEEDLE_MODEL}: tokenizer missing"
    return NEEDLE_MODEL


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    """A writable copy of the needle model's tokenizer files (no weights), to break on purpose."""
    target = tmp_path / "model"
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(NEEDLE_MODEL / name, target / name)
    return target


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    """A folder for a spec beside a model folder `model` whose config.json is empty."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path
