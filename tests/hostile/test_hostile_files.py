"""Files and text a hostile or unlucky user names: FIFOs and devices where a file is
expected, TOML and JSON nested hundreds of levels deep, braces in needle text, a chat template
that loops, a public key as the inventory's key, --ids-out onto nowhere. Each is one line and
exit 2 (or exit 1 for a failure while running), at once: nothing waits on a FIFO."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_hostile_input import cli

from devices.files import MAX_FILE_BYTES, read_bytes
from harness.cli import main
from harness.errors import InputError
from harness.workloads import NeedleTemplate, load_tokenizer, needle_prompt

SPEC = """name = "files"
model = "{model}"
devices = ["local"]
[engine.policy.exact]
[[workload]]
kind = "{kind}"
{workload}
"""
NEEDLE = "ctx = 256\ndepth = 0.5\n"


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def spec(folder: Path, model: Path, workload: str, kind: str = "needle") -> Path:
    path = folder / "spec.toml"
    path.write_text(SPEC.format(model=model, kind=kind, workload=workload))
    return path


@pytest.mark.parametrize("key, kind, workload", [
    ("workload[0].filler", "needle", NEEDLE + 'filler = "{file}"\n'),
    ("workload[0].text", "ppl", 'length = 64\ntext = "{file}"\n'),
])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_spec_material_files_that_are_not_regular_are_refused(
        tmp_path, capsys, sqlite_url, needle_model, key, kind, workload, special):
    target = fifo(tmp_path / "text") if special == "fifo" else Path(special)
    path = spec(tmp_path, needle_model, workload.format(file=target), kind)
    code, err = cli(capsys, "--db", sqlite_url, "run", str(path), "--dry-run")
    assert code == 2 and f"key '{key}'" in err, err
    if key.endswith("filler"):
        assert ("FIFO" if special == "fifo" else "device") in err


def test_a_spec_or_inventory_that_is_a_fifo_is_refused(tmp_path, capsys, sqlite_url) -> None:
    code, err = cli(capsys, "--db", sqlite_url, "run", str(fifo(tmp_path / "spec.toml")))
    assert code == 2 and "not a regular file (it is a FIFO)" in err
    code, err = cli(capsys, "devices", "list", "--inventory", str(fifo(tmp_path / "inv.toml")))
    assert code == 2 and "not a regular file (it is a FIFO)" in err


def test_reads_are_capped(tmp_path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(OSError, match="larger than 64 MiB"):
        read_bytes(big)
    assert read_bytes(big, MAX_FILE_BYTES + 1) == b"\0" * (MAX_FILE_BYTES + 1)


DEEP = 600  # levels: beyond what tomllib's recursion allows


@pytest.mark.parametrize("command", ["spec", "claims", "inventory"])
def test_toml_nested_hundreds_deep_is_one_line(tmp_path, capsys, sqlite_url, command) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * DEEP + "]" * DEEP + "\n")
    argv = {"spec": ["--db", sqlite_url, "run", str(path)],
            "claims": ["--db", sqlite_url, "audit", str(path), "--stored-only"],
            "inventory": ["devices", "list", "--inventory", str(path)]}[command]
    code, err = cli(capsys, *argv)
    assert code == 2 and str(path) in err and "nested too deeply" in err, err


def test_tokenizer_config_nested_deep_is_an_input_error(tokenizer_dir) -> None:
    (tokenizer_dir / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=r"tokenizer_config.json: not valid JSON \(arrays or "
                                         r"objects nested more than 64 deep\)"):
        load_tokenizer(tokenizer_dir)


@pytest.mark.parametrize("needle", [
    "The {key.__class__.__mro__} code {0} of {key} is {value}.",
    "The {{key}} code {value!r:>{9999999}} of {key} is {value}.",
])
def test_needle_text_substitutes_only_its_placeholders(needle_tokenizer, needle) -> None:
    template = NeedleTemplate(needle=needle, question="What {is} the {} code of {key}?")
    assert template.needle_text("Zara", "12345") == needle.replace("{key}", "Zara").replace(
        "{value}", "12345")
    assert template.question_text("Zara") == "What {is} the {} code of Zara?"
    prompt = needle_prompt(needle_tokenizer, 256, 0.5, 0, needle_template=template)
    assert prompt.answer and len(prompt.ids) <= 256


@pytest.mark.parametrize("template, reason", [
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
     "{{ messages[0].content }}", "ran over 10 s"),
    ("{% for a in range(100000) %}{{ 'x' * 100 }}{% endfor %}{{ messages[0].content }}",
     "more than 1048576 characters"),
])
def test_a_chat_template_that_loops_or_floods_is_stopped(needle_model, tmp_path, template,
                                                         reason) -> None:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(needle_model / "tokenizer.json", model)
    config = json.loads((needle_model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    with pytest.raises(InputError, match=reason):
        needle_prompt(model, 256, 0.5, 0)


@pytest.mark.parametrize("where", ["missing", "/dev/full"])
def test_ids_out_onto_a_missing_folder_or_a_full_device(tmp_path, capsys, needle_model,
                                                        where) -> None:
    out = tmp_path / "no" / "ids.txt" if where == "missing" else Path(where)
    code, err = cli(capsys, "workload", "needle", "--model", str(needle_model), "--ctx", "128",
                    "--depth", "0.5", "--ids-out", str(out))
    assert (code, f"--ids-out {out}" in err) == ((2, True) if where == "missing" else (1, True))
    if where == "/dev/full":
        assert "No space left" in err


@pytest.fixture
def bad_key_inventory(farm, tmp_path) -> Path:
    public = tmp_path / "client.pub"  # the public half of the farm's client key
    public.write_text(subprocess.run(["ssh-keygen", "-y", "-f", str(farm.x86.key)], check=True,
                                     capture_output=True, text=True).stdout)
    text = farm.inventory_path.read_text().replace(f'"{farm.x86.key}"', f'"{public}"')
    path = tmp_path / "inventory.toml"
    path.write_text(text)
    return path


def test_a_public_key_as_the_inventory_key_is_one_line(bad_key_inventory, capsys, tmp_path,
                                                       sqlite_url, needle_model) -> None:
    # `run` refuses it before Ray starts (it was a Ray actor's traceback)
    assert main(["devices", "check", "--inventory", str(bad_key_inventory), "farm-x86"]) == 1
    shown = capsys.readouterr()
    assert "Traceback" not in shown.err and "not an SSH private key" in shown.out, shown
    path = SPEC.format(model=needle_model, kind="needle", workload=NEEDLE).replace(
        '["local"]', '["farm-x86"]')
    (tmp_path / "spec.toml").write_text(path)
    code, err = cli(capsys, "--db", sqlite_url, "run", str(tmp_path / "spec.toml"),
                    "--inventory", str(bad_key_inventory))
    assert code == 2 and "not an SSH private key" in err, err


@pytest.mark.parametrize("which", ["key", "known_hosts"])
def test_a_fifo_as_the_inventory_key_or_known_hosts_fails_at_once(farm, tmp_path, capsys,
                                                                  which) -> None:
    target = str(farm.x86.key) if which == "key" else str(farm.x86.known_hosts)
    text = farm.inventory_path.read_text().replace(f'"{target}"',
                                                   f'"{fifo(tmp_path / which)}"')
    path = tmp_path / "inventory.toml"
    path.write_text(text)
    assert main(["devices", "check", "--inventory", str(path), "farm-x86"]) == 1
    shown = capsys.readouterr()
    assert "Traceback" not in shown.err and "not a regular file" in shown.out, shown
