"""Untrusted chat templates are bounded in time and output size (a template comes with a model
download). Each attack below ran unbounded before: >20 s of nested loops, 2.5 GB from tojson."""

import threading

import pytest

from agentax.text._template import ChatTemplate, TemplateLimitError

MESSAGES = [{"role": "user", "content": "hi"}]

SIZE_ATTACKS = {
    "tojson_indent": "{{ messages | tojson(indent=200000000) }}",
    "repeat": "{{ 'a' * 10000000000 }}",
    "str_method_width": "{{ 'a'.ljust(10000000000) }}",
    "str_replace": "{% set a = 'a' * 1000000 %}{{ a.replace('a', 'a' * 1000) }}",
    "namespace_doubling": "{% set ns = namespace(x='a') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
    "list_doubling": "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}",
    "macro_doubling": "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ f('a', 60) }}",
    "power": "{{ 2 ** 100000000 }}",
    "format_filter_width": "{{ '%100000000d' | format(1) }}",
    "percent_width": "{{ '%100000000d' % 1 }}",
    "str_format_width": "{{ '{:>100000000}'.format(1) }}",
    "center_filter": "{{ 'a' | center(100000000) }}",
    "replace_filter": "{% set a = 'a' * 1000000 %}{{ a | replace('a', 'a' * 1000) }}",
    "output_flood": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(SIZE_ATTACKS))
def test_size_attacks_stop_at_max_chars(name):
    template = ChatTemplate(SIZE_ATTACKS[name], max_chars=1_000_000, timeout_s=30.0)
    with pytest.raises(TemplateLimitError, match="max_chars|power|indent"):
        template.render(MESSAGES)


@pytest.mark.parametrize("body", ["", "x"])
def test_nested_loops_stop_at_timeout(body):
    src = "{% for i in range(100000) %}{% for j in range(100000) %}" + body + "{% endfor %}{% endfor %}"
    with pytest.raises(TemplateLimitError, match="timeout_s=0.3"):
        ChatTemplate(src, timeout_s=0.3, max_chars=10**9).render(MESSAGES)


def test_bounds_leave_normal_renders_and_the_thread_alone():
    template = ChatTemplate(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ messages | tojson(indent=2) }}",
        timeout_s=0.2,
    )
    for _ in range(50):  # a cancelled watchdog never fires later into this thread
        out = template.render(MESSAGES)
    assert out.startswith("<user>hi[")
    done = threading.Event()
    threading.Timer(0.5, done.set).start()
    done.wait()  # time passes after the renders: no stray TemplateLimitError arrives here
    assert ChatTemplate("{{ 'ab' * 3 }}").render(MESSAGES) == "ababab"


def test_one_watchdog_thread_serves_renders_of_any_timeout():
    # Renders of a trusted template with a huge timeout leave finished watchdogs behind (each
    # waits for its deadline in the shared thread's heap): they are dropped, and a later render
    # with a short timeout still stops on time, in this thread and in another.
    from agentax.text._template import _DEADLINES

    trusted = ChatTemplate("{{ messages[0].content }}", timeout_s=1e6)
    for _ in range(10_000):
        assert trusted.render(MESSAGES) == "hi"
    assert len(_DEADLINES.heap) <= 4096
    src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    errors = []

    def render_slow():
        try:
            ChatTemplate(src, timeout_s=0.3, max_chars=10**9).render(MESSAGES)
        except TemplateLimitError as e:
            errors.append(str(e))

    other = threading.Thread(target=render_slow)
    other.start()
    render_slow()
    other.join(timeout=30)
    assert len(errors) == 2 and all("timeout_s=0.3" in e for e in errors)
    assert sum(t.name == "agentax-template-watchdog" for t in threading.enumerate()) == 1


def test_large_numbers_as_plain_values_still_render():
    src = "{{ '%d' | format(20250101) }} {{ '%s' % 123456789 }} {{ '{}'.format(98765432) }} {{ 12345678 | abs }}"
    assert ChatTemplate(src, max_chars=1_000_000).render(MESSAGES) == "20250101 123456789 98765432 12345678"
