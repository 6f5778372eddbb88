"""A model directory's tokenizer and chat template, used the way Hugging Face uses them.

``tokenizer.json`` is loaded with the ``tokenizers`` library; the chat template from
``tokenizer_config.json`` is rendered with jinja2 under the same settings as transformers'
``apply_chat_template`` (sandboxed, trim_blocks, lstrip_blocks, loop controls,
``raise_exception``, ``tojson``), bounded in time and size (``chat_template``), and the rendered
text is tokenised without extra special tokens.
Nothing here assumes a word-level vocabulary: a real Qwen3 checkpoint directory works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2
from tokenizers import Tokenizer

from devices.files import read_json, read_text
from harness.errors import InputError
from harness.workloads.chat_template import TemplateFailed, compile_template, render

# Private-use characters mark where each message's content lands in the rendered template.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"


@dataclass
class ChatRender:
    """A rendered conversation: the text and the character span of every message's content."""

    text: str
    content_spans: list[tuple[int, int]]


@dataclass
class ModelTokenizer:
    model_dir: Path
    tokenizer: Tokenizer
    chat_template: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    stop_ids: list[int] = field(default_factory=list)

    @property
    def im_end_id(self) -> int:
        """The id that ends an assistant turn (generation stops on it)."""
        return self.stop_ids[0]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, str]],
                    add_generation_prompt: bool = True) -> ChatRender:
        """Render ``messages`` with the chat template; also report where each content sits."""
        for message in messages:
            if _MARK_OPEN in message["content"] or _MARK_CLOSE in message["content"]:
                raise InputError("chat message content uses reserved private-use characters")
        marked = [{**m, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} for i, m in enumerate(messages)]
        rendered = _render_template(self, marked, add_generation_prompt)
        text, spans = "", [(-1, -1)] * len(messages)
        rest = rendered
        while _MARK_OPEN in rest:
            before, _, tail = rest.partition(_MARK_OPEN)
            number, _, rest = tail.partition(_MARK_CLOSE)
            text += before
            index = int(number)
            start = len(text)
            text += messages[index]["content"]
            spans[index] = (start, len(text))
        text += rest
        missing = [i for i, span in enumerate(spans) if span[0] < 0]
        if missing:
            raise InputError(f"{self.model_dir / 'tokenizer_config.json'}: the chat template "
                             f"dropped the content of message(s) {missing}")
        return ChatRender(text=text, content_spans=spans)


def _render_template(tok: ModelTokenizer, messages: list[dict[str, str]],
                     add_generation_prompt: bool) -> str:
    try:
        return render(tok.chat_template, {"messages": messages,
                                          "add_generation_prompt": add_generation_prompt,
                                          "enable_thinking": False, **tok.special_tokens})
    except TemplateFailed as exc:
        raise InputError(f"{tok.model_dir / 'tokenizer_config.json'}: chat_template does not "
                         f"render: {exc}") from exc


def _token_text(value) -> str | None:
    """Special tokens in tokenizer_config.json are strings or {"content": ...} objects."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _select_template(raw, config_path: Path) -> str:
    if isinstance(raw, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        raw = named.get("default")
    if not isinstance(raw, str) or not raw.strip():
        raise InputError(f"{config_path}: needs a non-empty 'chat_template' string "
                         "(or a list holding one named 'default')")
    return raw


def load_tokenizer(model_dir: str | Path) -> ModelTokenizer:
    return _load_tokenizer_cached(str(Path(model_dir).resolve()))


@lru_cache(maxsize=8)
def _load_tokenizer_cached(model_dir: str) -> ModelTokenizer:
    directory = Path(model_dir)
    tokenizer_path = directory / "tokenizer.json"
    config_path = directory / "tokenizer_config.json"
    if not tokenizer_path.is_file():
        raise InputError(f"{tokenizer_path}: missing (a model directory needs tokenizer.json)")
    try:  # through the capped, regular-file-only reader (a FIFO would hang the library)
        tokenizer = Tokenizer.from_str(read_text(tokenizer_path))
    except OSError as exc:
        raise InputError(f"{tokenizer_path}: cannot read it ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - the Rust library raises a bare Exception
        raise InputError(f"{tokenizer_path}: not a valid tokenizers file ({exc})") from None
    try:
        config = read_json(config_path)
    except FileNotFoundError:
        raise InputError(f"{config_path}: missing (it must hold the chat_template)") from None
    except OSError as exc:
        raise InputError(f"{config_path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"{config_path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: must be a JSON object")
    # Some checkpoints keep the template in a separate chat_template.jinja file.
    raw_template = config.get("chat_template")
    jinja_file = directory / "chat_template.jinja"
    if raw_template is None and jinja_file.is_file():
        try:
            raw_template = read_text(jinja_file)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{jinja_file}: cannot read it as UTF-8 text ({exc})") from exc
    template = _select_template(raw_template, config_path)
    _compile_template_checked(template, config_path)

    special = {name: text for name in ("bos_token", "eos_token", "pad_token", "unk_token")
               if (text := _token_text(config.get(name))) is not None}
    stop_ids = []
    for text in ("<|im_end|>", special.get("eos_token"), "<|endoftext|>"):
        token_id = tokenizer.token_to_id(text) if text else None
        if token_id is not None and token_id not in stop_ids:
            stop_ids.append(token_id)
    if not stop_ids:
        raise InputError(f"{tokenizer_path}: has no end-of-turn token (<|im_end|> or the "
                         f"eos_token of {config_path.name}), so generation cannot stop")
    return ModelTokenizer(model_dir=directory, tokenizer=tokenizer, chat_template=template,
                          special_tokens=special, stop_ids=stop_ids)


def _compile_template_checked(template: str, config_path: Path) -> None:
    try:
        compile_template(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{config_path}: chat_template is not valid jinja2 "
                         f"(line {exc.lineno}: {exc.message})") from exc
