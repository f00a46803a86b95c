"""The built-in ChatML chat template of the byte tokenizer.

Short on purpose (the tiny model trains on it on CPU, and every byte is a token):

    <|im_start|>system\\n{system}\\nTools:\\n{tool json}\\n...<|im_end|>\\n     (tools only)
    <|im_start|>{role}\\n{content}<|im_end|>\\n                             (system / user)
    <|im_start|>assistant\\n{content}<tool_call>{json}</tool_call>...<|im_end|>\\n
    <|im_start|>tool\\n<tool_response>{content}</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n                                             (generation prompt)

Each message renders on its own, so the template is prefix-stable: adding messages never
changes the text of earlier ones. Tool calls are compact Hermes calls,
`{"name":"f","arguments":{...}}`, exactly `format_tool_call(call, "hermes", compact=True)`.
"""

__all__ = ["BYTE_CHAT_TEMPLATE"]

BYTE_CHAT_TEMPLATE = r"""
{%- set sep = (',', ':') -%}
{%- if tools -%}
  {{ '<|im_start|>system\n' }}
  {%- if messages and messages[0].role == 'system' %}{{ messages[0].content + '\n' }}{% endif -%}
  {{ 'Tools:' }}
  {%- for t in tools -%}
    {{ '\n' + ((t.function if t.function is defined else t) | tojson(separators=sep)) }}
  {%- endfor -%}
  {{ '<|im_end|>\n' }}
{%- endif -%}
{%- for m in messages -%}
  {%- if not (loop.first and tools and m.role == 'system') -%}
    {{ '<|im_start|>' + m.role + '\n' }}
    {%- if m.role == 'tool' -%}
      {{ '<tool_response>' + m.content + '</tool_response>' }}
    {%- else -%}
      {{ m.content }}
    {%- endif -%}
    {%- if m.role == 'assistant' and m.tool_calls is defined -%}
      {%- for tc in m.tool_calls -%}
        {%- set f = tc.function if tc.function is defined else tc -%}
        {{ '<tool_call>{"name":' + (f.name | tojson) + ',"arguments":' }}
        {%- if f.arguments is string -%}
          {{ f.arguments }}
        {%- else -%}
          {{ (f.arguments if f.arguments is defined else {}) | tojson(separators=sep) }}
        {%- endif -%}
        {{ '}</tool_call>' }}
      {%- endfor -%}
    {%- endif -%}
    {{ '<|im_end|>\n' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{ '<|im_start|>assistant\n' }}
{%- endif -%}
"""
