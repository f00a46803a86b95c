"""`load_tokenizer`: one entry point for the built-in byte tokenizer and local HF tokenizers."""

from __future__ import annotations

from pathlib import Path

from agentax.text._byte import ByteTokenizer
from agentax.text._hf import HFTokenizer
from agentax.text._protocol import Tokenizer

__all__ = ["load_tokenizer"]


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """`"byte"` gives the built-in `ByteTokenizer`; a directory path gives an `HFTokenizer`."""
    if isinstance(spec, str) and spec == "byte":
        return ByteTokenizer()
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(f"tokenizer {str(spec)!r} is neither 'byte' nor an existing local directory")
    return HFTokenizer.from_pretrained(path)
