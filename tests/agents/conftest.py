"""Real tokenizers for trajectory tests: a small byte-level BPE trained in-process (no files,
no downloads) with the special tokens of Qwen2.5 / Qwen3 / Llama 3.1 and their real chat
templates from tests/text/templates (owned by the text team)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentax.text import ByteTokenizer, HFTokenizer

TEMPLATES = Path(__file__).parents[1] / "text" / "templates"
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]
LLAMA_SPECIAL = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
]  # fmt: skip
CORPUS = [
    "You are a helpful assistant. What is the weather in Paris today? It is sunny, 21 degrees.",
    '{"name": "calculator", "arguments": {"expression": "12*7"}} {"name": "get_weather", "parameters": {}}',
    "Let me think step by step. The answer is 84.\n\nassistant\nuser\nsystem\ntool\n",
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nEnvironment: ipython\n",
]


def _bpe(special, added):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = CORPUS + [p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))]
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def _qwen(template_file: str) -> HFTokenizer:
    tok = _bpe(QWEN_SPECIAL, QWEN_ADDED)
    return HFTokenizer(
        tok,
        special_tokens={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        chat_template=(TEMPLATES / template_file).read_text(),
        generation_eos_ids=[tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        name=template_file,
    )


@pytest.fixture(scope="session")
def qwen25_tok() -> HFTokenizer:
    return _qwen("qwen2_5.jinja")


@pytest.fixture(scope="session")
def qwen3_tok() -> HFTokenizer:
    return _qwen("qwen3.jinja")


@pytest.fixture(scope="session")
def llama31_tok() -> HFTokenizer:
    tok = _bpe(LLAMA_SPECIAL, [])
    return HFTokenizer(
        tok,
        special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        chat_template=(TEMPLATES / "llama3_1.jinja").read_text(),
        generation_eos_ids=[tok.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")],
        name="llama3_1",
    )


@pytest.fixture(scope="session")
def byte_tok() -> ByteTokenizer:
    return ByteTokenizer()
