"""agentax.text: tokenizers, chat templates, token-exact multi-turn rendering, tool-call parsers.

Layer 2 (see docs/design.md). Public names:

* `Tokenizer` (protocol), `ByteTokenizer` (built-in, vocab 272), `HFTokenizer` (local
  Hugging Face `tokenizers` directory), `load_tokenizer("byte" | dir)`.
* `ChatTemplate` — renders a model's own jinja chat template exactly as
  `transformers.apply_chat_template` would, without `transformers`; `BYTE_CHAT_TEMPLATE`.
* `render_prompt`, `render_continuation`, `render_conversation` (ids + assistant mask),
  `is_prefix_stable`, `RenderedConversation`.
* `parse_tool_calls`, `get_tool_parser`, `register_tool_parser`, `ParsedReply`,
  `format_tool_call` — Hermes/Qwen and Llama 3 JSON formats.
"""

from agentax.text import _hermes, _llama3  # noqa: F401  (register the built-in tool parsers)
from agentax.text._byte import ByteTokenizer
from agentax.text._chatml import BYTE_CHAT_TEMPLATE
from agentax.text._conversation import (
    RenderedConversation,
    is_prefix_stable,
    render_continuation,
    render_conversation,
    render_prompt,
)
from agentax.text._hf import HFTokenizer
from agentax.text._load import load_tokenizer
from agentax.text._protocol import Tokenizer
from agentax.text._template import ChatTemplate
from agentax.text._tool_calls import (
    ParsedReply,
    ToolParser,
    format_tool_call,
    get_tool_parser,
    parse_tool_calls,
    register_tool_parser,
)

__all__ = [
    "BYTE_CHAT_TEMPLATE",
    "ByteTokenizer",
    "ChatTemplate",
    "HFTokenizer",
    "ParsedReply",
    "RenderedConversation",
    "Tokenizer",
    "ToolParser",
    "format_tool_call",
    "get_tool_parser",
    "is_prefix_stable",
    "load_tokenizer",
    "parse_tool_calls",
    "register_tool_parser",
    "render_continuation",
    "render_conversation",
    "render_prompt",
]
