"""The workload generators: lengths, depths, needle spans, hashes, chat templates, errors, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from harness.cli import main
from harness.errors import InputError
from harness.workloads import (
    DEFAULT_NEEDLE,
    GrammarFiller,
    NeedleTemplate,
    answer_text,
    check_answer,
    decode_prompt,
    ids_hash,
    load_tokenizer,
    needle_prompt,
    ppl_tokens,
)

QWEN_STYLE_TEMPLATE = (  # the shape of Qwen3's template, including its thinking switch
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def _user_content(model_dir: Path, ids: list[int]) -> str:
    text = load_tokenizer(model_dir).decode(ids, skip_special_tokens=False)
    head, tail = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
    assert text.startswith(head) and text.endswith(tail)
    return text[len(head):-len(tail)]


@pytest.mark.parametrize("ctx", [128, 256, 1000, 2048, 4096])
@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_prompt_hits_length_depth_and_span(needle_tokenizer, ctx, depth):
    prompt = needle_prompt(needle_tokenizer, ctx, depth, seed=7)
    assert ctx - 16 <= len(prompt.ids) <= ctx
    tok = load_tokenizer(needle_tokenizer)
    needle = DEFAULT_NEEDLE.needle_text(prompt.key, prompt.answer)
    start, end = prompt.needle_span
    assert tok.decode(prompt.ids[start:end]).strip() == needle
    assert prompt.answer.isdigit() and len(prompt.answer) == 5
    # The needle sits at the requested fraction of the haystack, to within one sentence.
    haystack_start = 3  # <|im_start|> user \n
    question = len(tok.encode("\n\n" + DEFAULT_NEEDLE.question_text(prompt.key))) + 5
    haystack = len(prompt.ids) - haystack_start - question - (end - start)
    position = (start - haystack_start) / max(1, haystack)
    assert abs(position - depth) <= 24 / haystack


def test_needle_ids_equal_transformers_apply_chat_template(needle_tokenizer):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(needle_tokenizer)
    for ctx, depth in [(300, 0.5), (1024, 1.0)]:
        prompt = needle_prompt(needle_tokenizer, ctx, depth, seed=3)
        messages = [{"role": "user", "content": _user_content(needle_tokenizer, prompt.ids)}]
        reference = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(reference, dict) or hasattr(reference, "input_ids"):
            reference = reference["input_ids"]
        assert prompt.ids == list(reference)


def test_same_seed_same_needle_and_stable_hash(needle_tokenizer):
    a = needle_prompt(needle_tokenizer, 512, 0.25, seed=11)
    b = needle_prompt(needle_tokenizer, 512, 0.25, seed=11)
    assert a.ids == b.ids and a.hash == b.hash == ids_hash(a.ids)
    longer = needle_prompt(needle_tokenizer, 1024, 0.75, seed=11)
    assert (longer.key, longer.answer) == (a.key, a.answer)
    other = needle_prompt(needle_tokenizer, 512, 0.25, seed=12)
    assert other.hash != a.hash


def test_ppl_and_decode_streams(needle_tokenizer):
    stream = ppl_tokens(needle_tokenizer, 777, seed=2)
    assert len(stream.ids) == 777 and stream.hash == ids_hash(stream.ids)
    assert ppl_tokens(needle_tokenizer, 777, seed=2).ids == stream.ids
    assert ppl_tokens(needle_tokenizer, 777, seed=3).ids != stream.ids
    tok = load_tokenizer(needle_tokenizer)
    assert tok.tokenizer.token_to_id("<unk>") not in stream.ids
    decode = decode_prompt(needle_tokenizer, 600, seed=2)
    assert 584 <= len(decode.ids) <= 600
    assert tok.decode(decode.ids).rstrip().endswith("story about the village.\nassistant")


def test_check_answer_decodes_with_the_tokenizer(needle_tokenizer):
    tok = load_tokenizer(needle_tokenizer)
    generated = tok.encode("04217") + [tok.im_end_id] + tok.encode("99999")
    assert answer_text(needle_tokenizer, generated) == "04217"
    assert check_answer(needle_tokenizer, generated, "04217")
    assert not check_answer(tok, generated, "99999")  # after the stop token: not the answer
    assert not check_answer(tok, tok.encode("0421"), "04217")


@pytest.mark.parametrize("ctx, depth, match", [
    (20, 0.5, "too small"), (256, -0.1, "depth"), (256, 1.5, "depth"), (0, 0.5, "ctx"),
])
def test_impossible_requests_are_input_errors(needle_tokenizer, ctx, depth, match):
    with pytest.raises(InputError, match=match) as info:
        needle_prompt(needle_tokenizer, ctx, depth, seed=0)
    assert info.value.exit_code == 2


def _write_config(model_dir: Path, **changes) -> None:
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("breakage, match", [
    ("tokenizer", "not a valid tokenizers file"),
    ("no_template", "chat_template"),
    ("syntax", "not valid jinja2"),
    ("drops_content", "dropped the content"),
    ("raises", "does not render"),
])
def test_malformed_tokenizer_or_template_is_input_error(tokenizer_dir, breakage, match):
    if breakage == "tokenizer":
        (tokenizer_dir / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    elif breakage == "no_template":
        _write_config(tokenizer_dir, chat_template=None)
    elif breakage == "syntax":
        _write_config(tokenizer_dir, chat_template="{% for m in messages %}{{ m.content }")
    elif breakage == "drops_content":
        _write_config(tokenizer_dir, chat_template="<|im_start|>user\nhello<|im_end|>\n")
    else:
        _write_config(tokenizer_dir, chat_template="{{ raise_exception('no users here') }}")
    with pytest.raises(InputError, match=match) as info:
        needle_prompt(tokenizer_dir, 256, 0.5, seed=0)
    assert info.value.exit_code == 2


def test_bad_needle_template_is_input_error():
    with pytest.raises(InputError, match="value"):
        NeedleTemplate(needle="{key} has no value here.")


def _bpe_model_dir(tmp_path: Path) -> Path:
    """A byte-level BPE tokenizer with Qwen's digit splitting, like a real Qwen3 checkpoint."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}| ?\p{L}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+"),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                  "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    sentences = GrammarFiller().sentences(random.Random(0))
    tokenizer.train_from_iterator((next(sentences) for _ in range(3000)), trainer=trainer)
    model_dir = tmp_path / "bpe"
    model_dir.mkdir()
    tokenizer.save(str(model_dir / "tokenizer.json"))
    config = {"eos_token": {"content": "<|im_end|>"}, "chat_template": [
        {"name": "default", "template": QWEN_STYLE_TEMPLATE}]}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir


def test_workloads_work_with_a_bpe_tokenizer(tmp_path):
    model_dir = _bpe_model_dir(tmp_path)
    tok = load_tokenizer(model_dir)
    prompt = needle_prompt(model_dir, 700, 0.6, seed=5)
    assert 680 <= len(prompt.ids) <= 700
    start, end = prompt.needle_span
    assert DEFAULT_NEEDLE.needle_text(prompt.key, prompt.answer) in tok.decode(
        prompt.ids[start:end])
    assert tok.decode(prompt.ids, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt.stop_ids[0] == tok.tokenizer.token_to_id("<|im_end|>")
    assert len(ppl_tokens(model_dir, 300, seed=1).ids) == 300


def test_cli_prints_needle_json(needle_tokenizer, capsys, tmp_path):
    ids_file = tmp_path / "ids.txt"
    code = main(["workload", "needle", "--model", str(needle_tokenizer), "--ctx", "300",
                 "--depth", "0.5", "--seed", "4", "--ids-out", str(ids_file)])
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"ids", "answer", "needle_span", "hash"} <= set(record)
    assert record == needle_prompt(needle_tokenizer, 300, 0.5, seed=4).to_dict()
    assert ids_file.read_text().split() == [str(i) for i in record["ids"]]


def test_cli_bad_depth_exits_2_with_message(needle_tokenizer, capsys):
    code = main(["workload", "needle", "--model", str(needle_tokenizer), "--ctx", "300",
                 "--depth", "2", "--seed", "0"])
    assert code == 2
    assert "depth must be a number in [0, 1]" in capsys.readouterr().err


def test_cli_ppl_and_decode(needle_tokenizer, capsys):
    assert main(["workload", "ppl", "--model", str(needle_tokenizer), "--length", "64"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ids"]) == 64
    assert main(["workload", "decode", "--model", str(needle_tokenizer), "--ctx", "200"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ids"]) <= 200
