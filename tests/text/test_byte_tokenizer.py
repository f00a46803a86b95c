"""ByteTokenizer: the contract's ids, round trips, and its built-in ChatML template."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentax.records import Message, ToolCall
from agentax.text import ByteTokenizer, Tokenizer, format_tool_call, load_tokenizer, render_conversation

SPECIALS = {
    "<|pad|>": 256,
    "<|endoftext|>": 257,
    "<|im_start|>": 258,
    "<|im_end|>": 259,
    "<tool_call>": 260,
    "</tool_call>": 261,
    "<tool_response>": 262,
    "</tool_response>": 263,
}


def test_contract_ids():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and isinstance(tok, Tokenizer)
    assert tok.vocab_size == 272 and tok.eos_token_ids == (259, 257) and tok.pad_token_id == 256
    assert tok.bos_token_id is None
    for text, i in SPECIALS.items():
        assert tok.encode(text) == [i] and tok.decode([i]) == text
    assert tok.encode("aé") == [97, 0xC3, 0xA9]
    assert tok.decode([264, 271]) == "<|reserved_0|><|reserved_7|>"
    assert tok.encode("<|im_end|>", add_special_tokens=True) == [259]


def test_decode_skips_specials_and_replaces_bad_utf8():
    tok = ByteTokenizer()
    ids = tok.encode("<|im_start|>héllo<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "héllo"
    assert tok.decode([0xC3]) == "\ufffd"  # a cut multi-byte character never raises
    assert tok.decode(np.array([104, 105], dtype=np.int32)) == "hi"
    with pytest.raises(ValueError, match="outside the byte vocabulary"):
        tok.decode([272])


@given(st.text())
def test_round_trip_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < 264 for i in ids)
    assert len(ids) <= len(text.encode("utf-8"))


def test_builtin_template_format_and_mask():
    tok = ByteTokenizer()
    call = ToolCall(name="calc", arguments={"expr": "6*7"})
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="6*7?"),
        Message(role="assistant", content="Checking.", tool_calls=(call,)),
        Message(role="tool", content="42", name="calc"),
        Message(role="assistant", content="42"),
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    text = tok.chat_template.render(messages, tools=tools, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.\nTools:\n"
        '{"name":"calc","parameters":{"type":"object"}}<|im_end|>\n'
        "<|im_start|>user\n6*7?<|im_end|>\n"
        f"<|im_start|>assistant\nChecking.{format_tool_call(call, 'hermes', compact=True)}<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>42</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n42<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    rendered = render_conversation(tok, messages, tools=tools)
    assert rendered.prefix_stable and rendered.tokens_match
    generated = tok.decode(rendered.token_ids[rendered.assistant_mask == 1])
    assert generated == 'Checking.<tool_call>{"name":"calc","arguments":{"expr":"6*7"}}</tool_call><|im_end|>42<|im_end|>'
    assert rendered.token_ids.dtype == np.int32 and rendered.assistant_mask.dtype == np.int8


def test_builtin_template_without_system_or_tools():
    tok = ByteTokenizer()
    assert tok.chat_template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    tools = [{"name": "f"}]  # a bare function schema is listed as is
    assert tok.chat_template.render([{"role": "user", "content": "hi"}], tools=tools).startswith(
        '<|im_start|>system\nTools:\n{"name":"f"}<|im_end|>\n<|im_start|>user\n'
    )
