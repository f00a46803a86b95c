"""Tiny random Hugging Face checkpoints of the recipes' model families, built offline.

Each directory holds a random `transformers` model (Qwen2 / Qwen3 / Llama) saved as
safetensors, and a small byte-level BPE tokenizer trained in-process with the family's real
chat template (tests/text/templates), so the recipes run their real loading path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).parents[1] / "text" / "templates"
CORPUS = [
    "Solve the math problem step by step. Put the final answer in \\boxed{}.",
    "Tom has 3 apples and buys 4 more. How many apples does he have? The answer is 7.",
    '{"name": "calculator", "arguments": {"expression": "3 + 4"}}',
    "assistant\nuser\nsystem\ntool\n 0123456789 + - * / = ( )",
] + [p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))]

FAMILIES = {
    # name: (special tokens, added tokens, bos, template, eos token, transformers config)
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
              None, "qwen2_5.jinja", "<|im_end|>"),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>",
               "</tool_response>"], None, "qwen3.jinja", "<|im_end|>"),
    "llama": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"], [],
              "<|begin_of_text|>", "llama3_1.jinja", "<|eot_id|>"),
}


def _tokenizer(special, added, bos):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def make_checkpoint(directory: Path, family: str) -> Path:
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    special, added, bos, template, eos = FAMILIES[family]
    tok = _tokenizer(special, added, bos)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos,
                                   pad_token=special[0] if family != "llama" else eos,
                                   **({"bos_token": bos} if bos else {}))
    fast.chat_template = (TEMPLATES / template).read_text()
    fast.save_pretrained(str(directory))
    eos_ids = [tok.token_to_id(t) for t in special if t in ("<|im_end|>", "<|endoftext|>",
                                                             "<|eot_id|>", "<|end_of_text|>")]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "llama": transformers.LlamaConfig}[family]
    config = cls(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=8, tie_word_embeddings=True, torch_dtype="float32")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(directory), safe_serialization=True)
    return directory


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    return {f: make_checkpoint(tmp_path_factory.mktemp(f), f) for f in FAMILIES}


@pytest.fixture(scope="session")
def math_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gsm8k") / "train.jsonl"
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many apples?",
             "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"}
            for a, b in [(3, 4), (10, 5), (7, 8), (12, 30), (6, 6), (2, 9)]]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path
