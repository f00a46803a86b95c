"""Small real Hugging Face tokenizers built offline: a byte-level BPE trained in-process on a
few sentences, with the special tokens of Qwen2.5 / Qwen3 / Llama 3.1 and their real chat
templates (tests/text/templates), saved with transformers' `save_pretrained`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).parent / "templates"

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]
LLAMA_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]

CORPUS = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "What is the weather in Paris today? It is sunny, 21 degrees.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}',
    "Let me think step by step. The answer is 42.\n\nassistant\nuser\nsystem\ntool\n",
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nEnvironment: ipython\n",
    "Given the following functions, please respond with a JSON for a function call.",
    "ünïcödé tèxt — 日本語のテキスト — emoji 🙂 and numbers 1234567890",
    "\n\n".join(["Paragraph"] * 30),  # so that "\n\n" becomes one token, as in real vocabularies
] + [p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))]


# The pre-tokenizer split patterns of the real tokenizer.json files (Qwen2 / Llama 3 families).
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _train(special: list[str], added: list[str], bos: str | None, split: str):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


def _save(directory: Path, tok, template: str, generation: dict, **special) -> Path:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.chat_template = template
    fast.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


@pytest.fixture(scope="session")
def qwen25_dir(tmp_path_factory) -> Path:
    tok = _train(QWEN_SPECIAL, QWEN_ADDED, None, QWEN_SPLIT)
    return _save(
        tmp_path_factory.mktemp("qwen25"),
        tok,
        (TEMPLATES / "qwen2_5.jinja").read_text(),
        {"eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]},
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    tok = _train(QWEN_SPECIAL, QWEN_ADDED, None, QWEN_SPLIT)
    return _save(
        tmp_path_factory.mktemp("qwen3"),
        tok,
        (TEMPLATES / "qwen3.jinja").read_text(),
        {"eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]},
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


@pytest.fixture(scope="session")
def llama31_dir(tmp_path_factory) -> Path:
    tok = _train(LLAMA_SPECIAL, [], "<|begin_of_text|>", LLAMA_SPLIT)
    ids = [tok.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    return _save(
        tmp_path_factory.mktemp("llama31"),
        tok,
        (TEMPLATES / "llama3_1.jinja").read_text(),
        {"bos_token_id": tok.token_to_id("<|begin_of_text|>"), "eos_token_id": ids},
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )
