"""ChatTemplate's jinja environment behaves like transformers' (filters, globals, sandbox)."""

from __future__ import annotations

from datetime import datetime

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from agentax.text import BYTE_CHAT_TEMPLATE, ChatTemplate

FEATURES = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
    "{{ m.content | tojson }}|{{ m | tojson(indent=2, sort_keys=true) }}|"
    "{{ m | tojson(separators=(',', ':')) }}\n{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}"
    "{% set ns = namespace(n=0) %}{% for t in tools or [] %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "tools={{ ns.n }} think={{ enable_thinking }} {{ dict(a=1) | tojson }}"
    "{% generation %}GEN{% endgeneration %}"
    "    {% if add_generation_prompt %}\n  <start>\n{% endif %}"
)
MESSAGES = [
    {"role": "user", "content": "<b>&'\"é日本</b>"},
    {"role": "skip", "content": "hidden"},
    {"role": "assistant", "content": "x", "tool_calls": None},
    {"role": "user", "content": "after break"},
]


@pytest.mark.parametrize("gen", [False, True])
def test_features_render_like_transformers(gen):
    tools = [{"type": "function", "function": {"name": "f"}}]
    # apply_chat_template drops None-valued keys before rendering; render_jinja_template does not
    normalized = [{k: v for k, v in m.items() if v is not None} for m in MESSAGES]
    want, _ = render_jinja_template(
        [normalized], tools=tools, chat_template=FEATURES, add_generation_prompt=gen, bos_token="<s>", enable_thinking=False
    )
    got = ChatTemplate(FEATURES, bos_token="<s>").render(MESSAGES, tools=tools, add_generation_prompt=gen, enable_thinking=False)
    assert got == want[0]
    assert '"<b>&\'\\"é日本</b>"' in got  # no HTML escaping, no ASCII escaping
    assert "tool_calls" not in got  # None-valued keys are dropped, as transformers does


def test_globals_raise_and_date():
    with pytest.raises(jinja2.TemplateError, match="bad role"):
        ChatTemplate("{{ raise_exception('bad role') }}").render([])
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]) == str(datetime.now().year)


@pytest.mark.parametrize(
    "source", ["{{ ''.__class__.__mro__ }}", "{% set ns = namespace(_x=1) %}", "{% set ns = namespace() %}{% set ns._y = 2 %}"]
)
def test_sandbox_blocks_escapes(source):
    with pytest.raises(jinja2.exceptions.SecurityError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_bad_template_source_raises_with_line():
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ValueError, match="empty"):
        ChatTemplate("  ")


def test_extra_kwargs_override_special_tokens():
    t = ChatTemplate("{{ eos_token }}{{ pad_token }}", eos_token="</s>", special_tokens={"pad_token": "<pad>"})
    assert t.render([]) == "</s><pad>"
    assert t.render([], eos_token="E") == "E<pad>"


def test_byte_template_matches_transformers_renderer():
    messages = [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": [1, "é"]}}}]},
        {"role": "tool", "content": "r"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for t in (None, tools):
        want, _ = render_jinja_template([messages], tools=t, chat_template=BYTE_CHAT_TEMPLATE, add_generation_prompt=True)
        assert ChatTemplate(BYTE_CHAT_TEMPLATE).render(messages, tools=t, add_generation_prompt=True) == want[0]


def test_pydantic_messages_render_as_their_model_dump():
    """OpenAI-SDK-style message objects (pydantic models) render like their dicts, as
    transformers renders `message.model_dump()`, not as a `<ClassName>` placeholder."""
    from pathlib import Path

    from pydantic import BaseModel

    from agentax.text import ByteTokenizer, render_conversation

    class Function(BaseModel):
        name: str
        arguments: str

    class ToolCall(BaseModel):
        id: str
        type: str = "function"
        function: Function

    class ChatMessage(BaseModel):
        role: str
        content: str | None = None
        tool_calls: list[ToolCall] | None = None

    messages = [
        ChatMessage(role="user", content="What is 2+2?"),
        ChatMessage(role="assistant", tool_calls=[
            ToolCall(id="c1", function=Function(name="add", arguments='{"a": 2, "b": 2}'))]),
        {"role": "tool", "content": "4"},
        ChatMessage(role="assistant", content="4"),
    ]
    dicts = [m if isinstance(m, dict) else m.model_dump() for m in messages]
    source = (Path(__file__).parent / "templates" / "qwen2_5.jinja").read_text()
    normalized = [{k: v for k, v in m.items() if v is not None} for m in dicts]
    want, _ = render_jinja_template([normalized], chat_template=source, add_generation_prompt=True)
    got = ChatTemplate(source).render(messages, add_generation_prompt=True)
    assert got == want[0] and '"name": "add"' in got and "<ChatMessage>" not in got
    tok = ByteTokenizer()
    assert render_conversation(tok, messages).text == render_conversation(tok, dicts).text


def test_openai_sdk_message_renders_like_its_dict():
    openai_chat = pytest.importorskip("openai.types.chat")
    message = openai_chat.ChatCompletionMessage(role="assistant", content="hi")
    template = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")
    assert template.render([{"role": "user", "content": "yo"}, message]) == "user:yo;assistant:hi;"
