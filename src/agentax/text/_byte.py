"""`ByteTokenizer`: raw UTF-8 bytes plus a handful of special tokens; needs no files.

Ids 0..255 are bytes; 256.. are the special tokens below; 264..271 are reserved (decoded as
`<|reserved_k|>`). The tiny built-in model uses this vocabulary (272 ids).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentax.text._chatml import BYTE_CHAT_TEMPLATE
from agentax.text._template import ChatTemplate

__all__ = ["ByteTokenizer"]

_SPECIAL = (
    "<|pad|>",  # 256
    "<|endoftext|>",  # 257
    "<|im_start|>",  # 258
    "<|im_end|>",  # 259
    "<tool_call>",  # 260
    "</tool_call>",  # 261
    "<tool_response>",  # 262
    "</tool_response>",  # 263
)
_NUM_RESERVED = 8
_TOKEN_TO_ID = {tok: 256 + i for i, tok in enumerate(_SPECIAL)}
_ID_TO_TOKEN = {i: tok for tok, i in _TOKEN_TO_ID.items()}
_ID_TO_TOKEN.update({256 + len(_SPECIAL) + k: f"<|reserved_{k}|>" for k in range(_NUM_RESERVED)})
# Longest first, so that no special string is matched by a shorter one it contains.
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in sorted(_SPECIAL, key=len, reverse=True)))


class ByteTokenizer:
    """Byte-level tokenizer with ChatML special tokens (vocab 272, eos <|im_end|>/<|endoftext|>)."""

    vocab_size: int = 256 + len(_SPECIAL) + _NUM_RESERVED
    pad_token_id: int = _TOKEN_TO_ID["<|pad|>"]
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = (_TOKEN_TO_ID["<|im_end|>"], _TOKEN_TO_ID["<|endoftext|>"])
    special_tokens: tuple[str, ...] = _SPECIAL

    def __init__(self) -> None:
        self._template = ChatTemplate(
            BYTE_CHAT_TEMPLATE, eos_token="<|im_end|>", special_tokens={"pad_token": "<|pad|>"}
        )

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    def token_to_id(self, token: str) -> int | None:
        """Id of a special-token string (or of a single byte character), else None."""
        if token in _TOKEN_TO_ID:
            return _TOKEN_TO_ID[token]
        raw = token.encode("utf-8")
        return raw[0] if len(raw) == 1 else None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """UTF-8 bytes of `text`, with each special-token string as its single id.

        `add_special_tokens` is accepted for protocol compatibility; there is no bos to add.
        """
        ids: list[int] = []
        pos = 0
        for match in _SPECIAL_RE.finditer(text):
            ids.extend(text[pos : match.start()].encode("utf-8"))
            ids.append(_TOKEN_TO_ID[match.group()])
            pos = match.end()
        ids.extend(text[pos:].encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. Ids outside the vocabulary raise."""
        parts: list[str] = []
        buf = bytearray()
        for raw in ids:
            i = int(raw)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if i not in _ID_TO_TOKEN:
                raise ValueError(f"token id {i} is outside the byte vocabulary [0, {self.vocab_size})")
            parts.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens:
                parts.append(_ID_TO_TOKEN[i])
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"
