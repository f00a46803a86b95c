"""Our ChatTemplate + HFTokenizer against transformers' apply_chat_template on real templates."""

from __future__ import annotations

import copy

import pytest
from text_helpers import ADD_TOOL, WEATHER_TOOL, call
from transformers import AutoTokenizer

from agentax.records import Message, ToolCall
from agentax.text import HFTokenizer, load_tokenizer

QWEN25_CASES = {
    "default_system": ([{"role": "user", "content": "Hi there"}], None, {}),
    "tools_default_system": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL, ADD_TOOL], {}),
    "tool_round_trip": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris and 2+3?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [call("get_weather", city="Paris"), call("add", a=2, b=3)],
            },
            {"role": "tool", "name": "get_weather", "content": '{"temp": 21, "sky": "sunny"}'},
            {"role": "tool", "name": "add", "content": "5"},
            {"role": "assistant", "content": "Sunny, 21°C; 2+3=5 — 日本."},
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER_TOOL, ADD_TOOL],
        {},
    ),
    "call_without_content": (
        [{"role": "user", "content": "add"}, {"role": "assistant", "content": "", "tool_calls": [call("add", a=1, b=2)]}],
        [ADD_TOOL],
        {},
    ),
}

QWEN3_CASES = {
    "thinking_multi_turn": (
        [
            {"role": "user", "content": "What is 6*7?"},
            {"role": "assistant", "content": "<think>\n6 times 7.\n</think>\n\n42"},
            {"role": "user", "content": "And 6*8?"},
            {"role": "assistant", "content": "<think>\nsix eights\n</think>\n\n48"},
        ],
        None,
        {},
    ),
    "reasoning_content_and_tools": (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I should call the tool.",
                "tool_calls": [call("get_weather", city="Oslo", unit="celsius")],
            },
            {"role": "tool", "content": "snow"},
        ],
        [WEATHER_TOOL],
        {},
    ),
    "no_thinking_prompt": ([{"role": "user", "content": "Quick answer"}], None, {"enable_thinking": False}),
}

LLAMA_CASES = {
    "plain": ([{"role": "system", "content": " Be nice. "}, {"role": "user", "content": "Hello"}], None, {}),
    "tools_in_user_message": (
        [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "tool_calls": [call("get_weather", city="Rome")]},
            {"role": "tool", "content": '{"temp": 30}'},
            {"role": "assistant", "content": "Hot: 30 degrees."},
        ],
        [WEATHER_TOOL],
        {"date_string": "03 Mar 2025"},
    ),
    "tools_in_system": ([{"role": "user", "content": "2+2?"}], [ADD_TOOL], {"tools_in_user_message": False}),
}


def _compare(directory, messages, tools, extra, add_generation_prompt):
    hf = AutoTokenizer.from_pretrained(str(directory))
    ours = HFTokenizer.from_pretrained(directory)
    kwargs = dict(tools=tools, add_generation_prompt=add_generation_prompt, **extra)
    want_text = hf.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
    want_ids = hf.apply_chat_template(copy.deepcopy(messages), tokenize=True, return_dict=True, **kwargs)["input_ids"]
    got_text = ours.chat_template.render(messages, **kwargs)
    assert got_text == want_text
    assert ours.encode(got_text) == list(want_ids)
    assert ours.decode(ours.encode(got_text)) == got_text


@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("case", sorted(QWEN25_CASES))
def test_qwen25_matches_transformers(qwen25_dir, case, gen):
    _compare(qwen25_dir, *QWEN25_CASES[case], gen)


@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("case", sorted(QWEN3_CASES))
def test_qwen3_matches_transformers(qwen3_dir, case, gen):
    _compare(qwen3_dir, *QWEN3_CASES[case], gen)


@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_llama31_matches_transformers(llama31_dir, case, gen):
    _compare(llama31_dir, *LLAMA_CASES[case], gen)


def test_llama31_renders_bos_tools_and_date(llama31_dir):
    messages, tools, extra = LLAMA_CASES["tools_in_user_message"]
    text = HFTokenizer.from_pretrained(llama31_dir).chat_template.render(messages, tools=tools, **extra)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert "Today Date: 03 Mar 2025" in text
    user_turn = text.split("<|start_header_id|>user<|end_header_id|>\n\n")[1]
    assert user_turn.startswith("Given the following functions") and '    "name": "get_weather"' in user_turn
    assert '{"name": "get_weather", "parameters": {"city": "Rome"}}<|eot_id|>' in text


def test_message_records_render_like_dicts(qwen25_dir):
    tok = HFTokenizer.from_pretrained(qwen25_dir)
    records = [
        Message(role="user", content="Add 1 and 2"),
        Message(role="assistant", content="", tool_calls=(ToolCall(name="add", arguments={"a": 1, "b": 2}),)),
        Message(role="tool", content="3", name="add"),
    ]
    dicts = [m.to_dict() for m in records]
    assert tok.chat_template.render(records, tools=[ADD_TOOL]) == tok.chat_template.render(dicts, tools=[ADD_TOOL])


def test_hf_tokenizer_reads_special_tokens_and_generation_config(qwen25_dir, llama31_dir):
    hf = AutoTokenizer.from_pretrained(str(qwen25_dir))
    qwen = load_tokenizer(qwen25_dir)
    assert isinstance(qwen, HFTokenizer)
    im_end, eot = hf.convert_tokens_to_ids("<|im_end|>"), hf.convert_tokens_to_ids("<|endoftext|>")
    assert qwen.eos_token_ids == (im_end, eot)
    assert qwen.pad_token_id == eot and qwen.bos_token_id is None
    assert qwen.vocab_size == len(hf)
    text = "a <tool_call>{}</tool_call> <|im_end|>"
    assert qwen.encode(text) == hf.encode(text, add_special_tokens=False)
    assert qwen.decode(qwen.encode(text), skip_special_tokens=True) == hf.decode(hf.encode(text), skip_special_tokens=True)

    llama = HFTokenizer.from_pretrained(llama31_dir)
    hf_llama = AutoTokenizer.from_pretrained(str(llama31_dir))
    assert llama.bos_token_id == hf_llama.bos_token_id
    assert llama.eos_token_ids[0] == hf_llama.convert_tokens_to_ids("<|eot_id|>") and len(llama.eos_token_ids) == 3
    assert llama.pad_token_id == llama.eos_token_ids[0]  # no pad token: falls back to eos
    assert llama.encode("hi", add_special_tokens=True) == hf_llama.encode("hi", add_special_tokens=True)
    assert llama.encode("hi", add_special_tokens=True)[0] == llama.bos_token_id


def test_chat_template_jinja_file_and_errors(qwen25_dir, tmp_path):
    import shutil

    assert (qwen25_dir / "chat_template.jinja").is_file()  # transformers 5 saves the template there
    shutil.copy(qwen25_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": {"content": "<|im_end|>", "special": true}}')
    bare = HFTokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        bare.chat_template
    legacy = '{"eos_token": "<|im_end|>", "chat_template": [{"name": "default", "template": "{{ messages[0].content }}"}]}'
    (tmp_path / "tokenizer_config.json").write_text(legacy)
    assert HFTokenizer.from_pretrained(tmp_path).chat_template.render([{"role": "user", "content": "x"}]) == "x"
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|nope|>"}')
    with pytest.raises(ValueError, match="not in its vocabulary"):
        HFTokenizer.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_pretrained(tmp_path / "missing")
    with pytest.raises(ValueError, match="neither 'byte'"):
        load_tokenizer(tmp_path / "missing")
