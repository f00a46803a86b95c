"""Three tiny Python repositories, each with one bug that a unit test catches.

They are data for `SWEEnvironment` (and its tests and example): small enough to read in one
go, real enough that the fix needs reading, searching, editing and running pytest. Each entry
has the repository's files, the issue text given to the agent, and a reference fix
(path, old text, new text) that makes the failing test pass.
"""

from __future__ import annotations

SWE_REPOS: dict[str, dict] = {
    "textstats": {
        "issue": (
            "word_count() gives wrong results when words are separated by more than one space "
            "or by newlines: word_count('a  b') returns 3 instead of 2."
        ),
        "fix": ("textstats/core.py", 'return len(text.split(" "))', "return len(text.split())"),
        "files": {
            "README.md": "# textstats\n\nTiny text statistics helpers.\n",
            "textstats/__init__.py": "from textstats.core import char_count, word_count\n",
            "textstats/core.py": (
                '"""Counting helpers."""\n\n\n'
                "def word_count(text: str) -> int:\n"
                '    """Number of whitespace-separated words in `text`."""\n'
                "    if not text.strip():\n"
                "        return 0\n"
                '    return len(text.split(" "))\n\n\n'
                "def char_count(text: str, *, spaces: bool = True) -> int:\n"
                '    """Number of characters, optionally without whitespace."""\n'
                "    return len(text) if spaces else sum(not c.isspace() for c in text)\n"
            ),
            "tests/test_core.py": (
                "from textstats import char_count, word_count\n\n\n"
                "def test_simple():\n"
                '    assert word_count("the quick fox") == 3\n\n\n'
                "def test_empty():\n"
                '    assert word_count("   ") == 0\n\n\n'
                "def test_irregular_spacing():\n"
                '    assert word_count("one  two") == 2\n'
                '    assert word_count("a\\nb c") == 3\n\n\n'
                "def test_chars():\n"
                '    assert char_count("a b", spaces=False) == 2\n'
            ),
        },
    },
    "intervals": {
        "issue": (
            "merge() does not merge intervals that only touch: merge([(1, 2), (2, 3)]) should be "
            "[(1, 3)] but gives [(1, 2), (2, 3)]."
        ),
        "fix": ("intervals.py", "if merged and start < merged[-1][1]:", "if merged and start <= merged[-1][1]:"),
        "files": {
            "intervals.py": (
                '"""Closed integer intervals."""\n\n\n'
                "def merge(intervals):\n"
                '    """Merge overlapping or touching closed intervals; returns a sorted list."""\n'
                "    merged = []\n"
                "    for start, end in sorted(intervals):\n"
                "        if merged and start < merged[-1][1]:\n"
                "            merged[-1] = (merged[-1][0], max(merged[-1][1], end))\n"
                "        else:\n"
                "            merged.append((start, end))\n"
                "    return merged\n"
            ),
            "test_intervals.py": (
                "from intervals import merge\n\n\n"
                "def test_overlap():\n"
                "    assert merge([(5, 8), (1, 6)]) == [(1, 8)]\n\n\n"
                "def test_disjoint():\n"
                "    assert merge([(1, 2), (4, 5)]) == [(1, 2), (4, 5)]\n\n\n"
                "def test_touching():\n"
                "    assert merge([(1, 2), (2, 3)]) == [(1, 3)]\n"
            ),
        },
    },
    "roman": {
        "issue": "to_roman(4) returns 'IIII' and to_roman(9) returns 'VIIII'; they should be 'IV' and 'IX'.",
        "fix": (
            "roman/convert.py",
            '(10, "X"), (5, "V"), (1, "I")',
            '(10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")',
        ),
        "files": {
            "roman/__init__.py": "from roman.convert import to_roman\n",
            "roman/convert.py": (
                '"""Integers to Roman numerals."""\n\n'
                "_VALUES = [\n"
                '    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),\n'
                '    (50, "L"), (40, "XL"), (10, "X"), (5, "V"), (1, "I"),\n'
                "]\n\n\n"
                "def to_roman(n: int) -> str:\n"
                '    """Roman numeral of 1 <= n <= 3999."""\n'
                "    if not 1 <= n <= 3999:\n"
                '        raise ValueError(f"out of range: {n}")\n'
                "    out = []\n"
                "    for value, letters in _VALUES:\n"
                "        while n >= value:\n"
                "            out.append(letters)\n"
                "            n -= value\n"
                '    return "".join(out)\n'
            ),
            "tests/test_convert.py": (
                "import pytest\n\n"
                "from roman import to_roman\n\n\n"
                '@pytest.mark.parametrize("n, s", [(1, "I"), (3, "III"), (4, "IV"), (9, "IX"), (14, "XIV"), (1994, "MCMXCIV")])\n'
                "def test_values(n, s):\n"
                "    assert to_roman(n) == s\n"
            ),
        },
    },
}
