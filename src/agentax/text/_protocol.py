"""The `Tokenizer` protocol every agentax tokenizer satisfies (byte-level or Hugging Face)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentax.text._template import ChatTemplate

__all__ = ["Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids, the special ids the engine needs, and the model's chat template."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    """Ids that end a generation; the first is the tokenizer's own eos token."""
    pad_token_id: int
    bos_token_id: int | None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`; special-token strings in the text become their single ids."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 is replaced, never raised."""
        ...

    @property
    def chat_template(self) -> ChatTemplate:
        """The chat template that formats conversations for this model."""
        ...
