"""math_verify: answer extraction and normalisation (boxed, fractions, separators, percent)."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentax.records import Task
from agentax.rewards import math_verify
from agentax.rewards._math import answers_match, extract_answer, parse_number


def score(response, answer, **kw):
    return math_verify(Task(id="t", answer=answer), response, **kw)


@pytest.mark.parametrize("response, answer", [
    ("so the result is \\boxed{\\frac{3}{4}}.", "0.75"),
    ("\\boxed{\\dfrac{3}{4}}", "3/4"),
    ("\\boxed{\\frac34}", "0.75"),
    ("-\\frac{1}{2} is \\boxed{-\\frac{1}{2}}", "-0.5"),
    ("The answer is 1,234.", "1234"),
    ("Total: $1,234,567.00", "1234567"),
    ("step\n#### 72", "72"),
    ("Answer: 3/4", "\\frac{3}{4}"),
    ("\\boxed{50\\%}", "50"),
    ("\\boxed{50\\%}", "0.5"),
    ("It costs 42 dollars", "42"),
    ("\\boxed{\\text{(B)}}", "B"),
    ("first \\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{{12}}", "12"),
    ("x = 0.333333333", "1/3"),
    ("answer: 1e3", "1000"),
    ("\\boxed{90^\\circ}", "90"),
])
def test_matches(response, answer):
    assert score(response, answer) == 1.0


@pytest.mark.parametrize("response, answer", [
    ("\\boxed{12}", "13"),
    ("no number here", "5"),
    ("\\boxed{0.75}", "0.7"),
    ("The answer is 1,234", "1.234"),
    ("\\boxed{50\\%}", "0.5"),  # with allow_percent=False below
])
def test_mismatches(response, answer):
    assert score(response, answer, allow_percent=False) == 0.0


def test_gold_may_be_boxed_and_missing_answer_is_user_error():
    assert score("I think 7", "#### 7") == 1.0
    assert score("\\boxed{7}", "\\boxed{7}") == 1.0
    with pytest.raises(ValueError, match="has no answer"):
        math_verify(Task(id="x"), "\\boxed{1}")


def test_extraction_order():
    assert extract_answer("3 apples and \\boxed{5} then 9") == "5"
    assert extract_answer("#### 8\nThe answer is 9") == "8"
    assert extract_answer("The answer is: 9 sheep") == "9 sheep"
    assert extract_answer("we had 3, then 4.5 more") == "4.5"
    assert extract_answer("") is None and extract_answer("nothing") is None


def test_tolerance():
    assert score("\\boxed{3.14159265}", "3.14159265358979") == 1.0
    assert score("\\boxed{3.14}", "3.14159265358979") == 0.0
    assert score("\\boxed{3.14}", "3.14159265358979", rel_tol=1e-2) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**12, 10**12), st.sampled_from(["\\boxed{{{}}}", "The answer is {}.", "#### {}", "so we get {}"]))
def test_thousands_separators_roundtrip(n, template):
    assert score(template.format(f"{n:,}"), str(n)) == 1.0
    assert score(template.format(f"{n:,}"), str(n + 1)) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(-999, 999), st.integers(1, 999), st.booleans())
def test_fraction_forms_agree(p, q, latex):
    text = f"\\frac{{{p}}}{{{q}}}" if latex else f"{p}/{q}"
    value, percent = parse_number(text)
    assert value == Fraction(p, q) and not percent
    assert answers_match(text, repr(p / q))
    assert score(f"\\boxed{{{text}}}", f"{p}/{q}") == 1.0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_never_raises_on_arbitrary_responses(text):
    assert score(text, "42") in (0.0, 1.0)
    extract_answer(text)
