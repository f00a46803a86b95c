"""`HFTokenizer`: a Hugging Face `tokenizers` tokenizer read from a local model directory.

Reads `tokenizer.json` (the vocabulary, merges, added tokens, pre/post-processing),
`tokenizer_config.json` (named special tokens, `chat_template`), and when present
`special_tokens_map.json`, `chat_template.jinja` (how transformers 5 saves templates) and
`generation_config.json` (whose `eos_token_id` may be a list: a chat model usually stops on
both its end-of-turn and end-of-text tokens). Needs no `transformers` and no network.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _RustTokenizer

from agentax.text._template import ChatTemplate

__all__ = ["HFTokenizer"]

_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or remove the file") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: Any) -> str | None:
    """A special token as saved: a string, or an AddedToken dict with its `content`."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template_source(directory: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None:
        legacy = directory / "chat_template.json"
        template = _read_json(legacy).get("chat_template") if legacy.is_file() else None
    return template if isinstance(template, str) else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


class HFTokenizer:
    """The `Tokenizer` protocol over a `tokenizers.Tokenizer` plus its config files."""

    def __init__(
        self,
        tokenizer: _RustTokenizer,
        *,
        special_tokens: Mapping[str, str | None],
        chat_template: str | None = None,
        generation_eos_ids: Sequence[int] = (),
        generation_pad_id: int | None = None,
        name: str = "",
    ) -> None:
        self._tok = tokenizer
        self._name = name
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))

        eos_ids = []
        if "eos_token" in self.special_tokens:
            eos_ids.append(self._require_id(self.special_tokens["eos_token"], "eos_token"))
        eos_ids += [i for i in generation_eos_ids if i not in eos_ids]
        if not eos_ids:
            raise ValueError(
                f"tokenizer {name!r} has no eos token: set `eos_token` in tokenizer_config.json "
                "or `eos_token_id` in generation_config.json"
            )
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = None if bos is None else self._require_id(bos, "bos_token")
        pad = self.special_tokens.get("pad_token")
        if pad is not None:
            self.pad_token_id: int = self._require_id(pad, "pad_token")
        else:  # padding positions are masked out; any valid id works, eos is the usual choice
            self.pad_token_id = generation_pad_id if generation_pad_id is not None else self.eos_token_ids[0]
        self._template = None
        if chat_template is not None:
            named = self.special_tokens
            self._template = ChatTemplate(
                chat_template,
                bos_token=named.get("bos_token"),
                eos_token=named.get("eos_token"),
                special_tokens={k: v for k, v in named.items() if k not in ("bos_token", "eos_token")},
            )

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, chat_template: str | None = None) -> HFTokenizer:
        """Load from a local directory holding at least `tokenizer.json`.

        Args:
          directory: a model or tokenizer directory (as `save_pretrained` writes it).
          chat_template: jinja source to use instead of the directory's own template.
        """
        directory = Path(directory)
        tok_file = directory / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(
                f"{tok_file} not found: HFTokenizer needs a fast-tokenizer file (save the tokenizer with "
                "transformers' PreTrainedTokenizerFast.save_pretrained to produce one)"
            )
        config = _read_json(directory / "tokenizer_config.json")
        special_map = _read_json(directory / "special_tokens_map.json")
        generation = _read_json(directory / "generation_config.json")
        special = {}
        for key in _NAMED_TOKENS:
            value = _token_text(config.get(key))
            special[key] = value if value is not None else _token_text(special_map.get(key))
        return cls(
            _RustTokenizer.from_file(str(tok_file)),
            special_tokens=special,
            chat_template=chat_template if chat_template is not None else _template_source(directory, config),
            generation_eos_ids=_as_id_list(generation.get("eos_token_id")),
            generation_pad_id=generation.get("pad_token_id"),
            name=str(directory),
        )

    def _require_id(self, token: str, what: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{what} {token!r} of tokenizer {self._name!r} is not in its vocabulary")
        return int(token_id)

    @property
    def chat_template(self) -> ChatTemplate:
        if self._template is None:
            raise ValueError(
                f"tokenizer {self._name!r} has no chat template: add `chat_template` to tokenizer_config.json, "
                "a chat_template.jinja file, or pass chat_template= to HFTokenizer.from_pretrained"
            )
        return self._template

    def token_to_id(self, token: str) -> int | None:
        """Id of one token string (special or not), or None when it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"HFTokenizer({self._name!r}, vocab_size={self.vocab_size}, eos={self.eos_token_ids})"
