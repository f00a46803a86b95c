"""`math_verify`: is the final answer in a response numerically equal to the task's answer?

The answer is taken from the last \\boxed{...} (or \\fbox), else a GSM8K "#### x" line, else an
"answer: x" / "the answer is x" line, else the last number in the text. Numbers may be written
as integers, decimals, scientific notation, with thousands separators (1,234), as fractions
(3/4, \\frac{3}{4}, \\dfrac34), with a trailing unit word, or as percentages (50%). Comparison
is numeric with a tolerance; non-numeric answers are compared as normalised strings.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from agentax.records import Task

__all__ = ["extract_answer", "normalize_answer", "parse_number", "math_verify", "answers_match"]

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} with balanced braces (or `\\boxed 5`)."""
    matches = list(_BOXED.finditer(text))
    for m in reversed(matches):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
            continue  # unbalanced: try an earlier one
        tail = re.match(r"([^\s$]+)", text[i:])
        if tail:
            return tail.group(1)
    return None


_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_LINE = re.compile(r"(?i)(?:final\s+)?answer\s*(?:is\s*:?|:|=)\s*([^\n]+)")
_NUMBER_IN_TEXT = re.compile(
    r"-?\\[dt]?frac\{[^{}]+\}\{[^{}]+\}|-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?%?|-?\.\d+%?"
)


def extract_answer(text: str) -> str | None:
    """The final-answer substring of a model response, or None if it has none."""
    if not isinstance(text, str) or not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1].strip()
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return lines[-1].strip()
    numbers = _NUMBER_IN_TEXT.findall(text)
    return numbers[-1].strip() if numbers else None


_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


def normalize_answer(text: str) -> str:
    """Strips LaTeX decoration, dollar signs, spacing commands and trailing punctuation."""
    s = text.strip()
    for _ in range(3):
        s = _WRAPPERS.sub(r"\1", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\$", "$", "\\(", "\\)",
                  "\\[", "\\]", "^\\circ", "^{\\circ}", "°", "\\displaystyle"):
        s = s.replace(token, "" if token not in ("\\,", "\\;", "\\:", "\\ ") else " ")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = s.rstrip(".").strip()
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _balanced(s[1:-1]):
        s = s[1:-1].strip()
    return s


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


_DECIMAL = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?"
_DECIMAL_RE = re.compile(rf"(?:{_DECIMAL})")
_FRAC_RE = re.compile(rf"([-+]?)\\frac\{{\s*({_DECIMAL})\s*\}}\{{\s*({_DECIMAL})\s*\}}")
_SLASH_RE = re.compile(rf"({_DECIMAL})\s*/\s*({_DECIMAL})")
_UNIT_RE = re.compile(r"\s*[A-Za-z][A-Za-z ]*")


def _decimal(s: str) -> Fraction:
    return Fraction(s.replace(",", ""))


def parse_number(text: str) -> tuple[Fraction, bool] | None:
    """(value, is_percent) of a normalised answer, or None if it is not a number.

    Accepts a trailing unit word ("42 apples") and a trailing percent sign.
    """
    s = normalize_answer(text)
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    candidates = [s]
    unit = re.match(rf"^(.*?\d\}}?)({_UNIT_RE.pattern})$", s)
    if unit:
        candidates.append(unit.group(1).strip())
    for c in candidates:
        try:
            if m := _FRAC_RE.fullmatch(c):
                num, den = _decimal(m.group(2)), _decimal(m.group(3))
                if den == 0:
                    return None
                value = num / den
                return (-value if m.group(1) == "-" else value), percent
            if m := _SLASH_RE.fullmatch(c):
                num, den = _decimal(m.group(1)), _decimal(m.group(2))
                return (None if den == 0 else (num / den, percent))  # type: ignore[return-value]
            if _DECIMAL_RE.fullmatch(c):
                return _decimal(c), percent
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
    return None


def _close(a: Fraction, b: Fraction, rel_tol: float, abs_tol: float) -> bool:
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:  # integers: 999999 is not 1000000
        return False
    try:
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=abs_tol)
    except OverflowError:
        return False


def _string_form(text: str) -> str:
    s = normalize_answer(text).replace(" ", "").casefold()
    if re.fullmatch(r"\(([a-z])\)", s):  # "(B)" -> "b"
        s = s[1]
    return s


def answers_match(predicted: str, gold: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9,
                  allow_percent: bool = True) -> bool:
    """True if two answer strings denote the same number (or the same normalised text)."""
    p, g = parse_number(predicted), parse_number(gold)
    if p is not None and g is not None:
        (pv, pp), (gv, gp) = p, g
        if _close(pv, gv, rel_tol, abs_tol):
            return True
        if allow_percent and pp and _close(pv / 100, gv, rel_tol, abs_tol):
            return True
        if allow_percent and gp and _close(pv, gv / 100, rel_tol, abs_tol):
            return True
        return False
    return _string_form(predicted) == _string_form(gold) != ""


def math_verify(task: Task, response: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9,
                allow_percent: bool = True) -> float:
    """1.0 if the response's final answer equals `task.answer` (numerically), else 0.0.

    `task.answer` may itself contain \\boxed{...} or "#### x"; those are extracted first.
    With `allow_percent`, "50%" matches both 50 and 0.5.

    Raises:
        ValueError: the task has no answer (a data problem, not a model problem).
    """
    if task.answer is None:
        raise ValueError(f"task {task.id!r} has no answer; math_verify needs Task.answer")
    gold = str(task.answer)
    if "\\boxed" in gold or "####" in gold:
        gold = extract_answer(gold) or gold
    predicted = extract_answer(response)
    if predicted is None:
        return 0.0
    return 1.0 if answers_match(predicted, gold, rel_tol=rel_tol, abs_tol=abs_tol, allow_percent=allow_percent) else 0.0
