"""The docs describe the present: short front pages, no dates, links that resolve.

History (dated figures, superseded runs, what was tried) belongs in CHANGELOG.md and git;
measured figures live in benchmarks/results/*.json, which keep their own dates.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH_README = ROOT / "benchmarks" / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DATE = re.compile(r"20\d\d-\d\d-\d\d")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def test_front_pages_are_short():
    assert len(README.read_text()) <= 8000, "README.md over 8,000 characters: move detail to docs/"
    assert len(BENCH_README.read_text()) <= 15000, (
        "benchmarks/README.md over 15,000 characters: keep one row per benchmark, history to CHANGELOG.md")


def test_no_dates_outside_the_changelog():
    dated = [f"{p.relative_to(ROOT)}:{n}: {m.group()}"
             for p in [README, BENCH_README, *DOCS]
             for n, line in enumerate(p.read_text().splitlines(), 1)
             for m in DATE.finditer(line)]
    assert dated == [], "dates belong in CHANGELOG.md (or benchmarks/results/*.json)"


def test_relative_links_resolve():
    broken = [f"{p.relative_to(ROOT)} -> {target}"
              for p in [README, BENCH_README, ROOT / "CHANGELOG.md", *DOCS]
              for target in LINK.findall(p.read_text())
              if "://" not in target and not target.startswith("mailto:")
              and not (p.parent / target).exists()]
    assert broken == []


def test_readme_keeps_its_two_commands():
    text = README.read_text()
    assert "bash scripts/setup.sh && .venv/bin/agentax train" in text
    assert "bash scripts/test.sh" in text
    assert (ROOT / "scripts" / "setup.sh").exists() and (ROOT / "scripts" / "test.sh").exists()


def test_benchmark_table_names_every_results_file():
    text = BENCH_README.read_text()
    missing = [p.name for p in (ROOT / "benchmarks" / "results").glob("*.json")
               if p.stem not in text]
    assert missing == [], "give each results file a row (its command) in benchmarks/README.md"
